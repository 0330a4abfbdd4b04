package dataplane

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// batchBytes bounds the values one BPF_MAP_LOOKUP_BATCH call of eachEntry
// reads (and so its buffer); batchMax bounds the elements.
const (
	batchBytes = 1 << 20
	batchMax   = 4096
)

// eachEntry calls fn with every key and value of m, reading up to batchMax
// elements (batchBytes of values) per BPF_MAP_LOOKUP_BATCH call. Map.Iterate
// reads each element with two system calls (next key, lookup): for an
// array map that is every one of its max_entries slots, used or not (the
// handle table's 262,144 took about 1.7 s per pass of the agent's start on
// this machine), and for the egress tables at 10,000 sessions of 100
// entries a million elements (bench/README.md). The pointers fn gets are
// valid during the call only. A hash bucket longer than a batch (ENOSPC,
// thousands of colliding keys) is an error, not retried: fn has seen part
// of the map by then.
func eachEntry[K, V any](m *ebpf.Map, fn func(k *K, v *V)) error {
	size := batchMax
	if vs := int(m.ValueSize()); vs > 0 {
		size = max(16, min(batchMax, batchBytes/vs))
	}
	keys := make([]K, size)
	vals := make([]V, size)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil // the end, after the last partial batch
		}
		if err == nil && n == 0 {
			err = errors.New("a batch lookup returned no element and no end")
		}
		if err != nil {
			return fmt.Errorf("read %v: %w", m, err)
		}
	}
}

// eachArray is eachEntry for an array map: every index, in order, with its
// value.
func eachArray[V any](m *ebpf.Map, fn func(index uint32, v *V)) error {
	if m.Type() != ebpf.Array {
		return fmt.Errorf("read %v: not an array map (%v)", m, m.Type())
	}
	return eachEntry(m, func(k *uint32, v *V) { fn(*k, v) })
}
