package dataplane

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestEachArrayReadsEveryIndex: eachArray gives every index of an array
// map once, in order, with the value the map holds there, across batches
// (a table of two whole batches and a partial third), including the last
// index. A map that is not an array is refused. (Handles and the handle
// table's reconcile, which read through it, are held by the handle tests.)
func TestEachArrayReadsEveryIndex(t *testing.T) {
	kerneltest.RequireRoot(t)
	const n = 2*arrayBatch + 1808
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: n})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	written := map[uint32]uint64{0: 7, 1: 8, arrayBatch - 1: 9, arrayBatch: 10, 2 * arrayBatch: 11, n - 1: 12}
	for k, v := range written {
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	next := uint32(0)
	err = eachArray(m, func(i uint32, v *uint64) {
		if i != next {
			t.Fatalf("index %d after %d", i, next-1)
		}
		next++
		if *v != written[i] {
			t.Errorf("index %d: value %d, the map holds %d", i, *v, written[i])
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if next != n {
		t.Fatalf("read %d indices of %d", next, n)
	}

	h, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := eachArray(h, func(uint32, *uint64) {}); err == nil {
		t.Error("eachArray read a hash map")
	}
}
