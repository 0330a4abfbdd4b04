package dataplane

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// arrayBatch is how many elements one BPF_MAP_LOOKUP_BATCH call of
// eachArray reads (a handle is 32 bytes: 128 KiB of values a call).
const arrayBatch = 4096

// eachArray calls fn with every index of the array map m and its value,
// in index order, reading arrayBatch elements per BPF_MAP_LOOKUP_BATCH
// call. An array map has all its max_entries elements, used or not, and
// Map.Iterate reads each with two system calls (next key, lookup): for the
// handle table's 262,144 slots that was about 1.7 s of the agent's start
// per pass on this machine, and the start made three passes (bench/README.md).
// Batch lookups of arrays are in every kernel the agent runs on (Linux 5.6+).
func eachArray[V any](m *ebpf.Map, fn func(index uint32, v *V)) error {
	if m.Type() != ebpf.Array {
		return fmt.Errorf("read %v: not an array map (%v)", m, m.Type())
	}
	keys := make([]uint32, arrayBatch)
	vals := make([]V, arrayBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(keys[i], &vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil // the end, after the last partial batch
		}
		if err != nil {
			return fmt.Errorf("read %v: %w", m, err)
		}
		if n == 0 {
			return fmt.Errorf("read %v: a batch lookup returned no element and no end", m)
		}
	}
}
