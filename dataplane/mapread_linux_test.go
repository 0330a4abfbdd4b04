package dataplane

import (
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestEachArrayReadsEveryIndex: eachArray gives every index of an array
// map once, in order, with the value the map holds there, across batches
// (a table of two whole batches and a partial third), including the last
// index. A map that is not an array is refused. (Handles and the handle
// table's reconcile, which read through it, are held by the handle tests.)
func TestEachArrayReadsEveryIndex(t *testing.T) {
	kerneltest.RequireRoot(t)
	const n = 2*batchMax + 1808
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: n})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	written := map[uint32]uint64{0: 7, 1: 8, batchMax - 1: 9, batchMax: 10, 2 * batchMax: 11, n - 1: 12}
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

// TestEachEntryReadsEveryElement: eachEntry gives every element of the
// map types the dataplane reads with it (the egress tables: an LPM trie
// and a hash; the flow records: an LRU hash) exactly once with its value,
// over several batches (values of 64 bytes: batches of batchMax), as
// Map.Iterate reads them, and an empty map gives none.
func TestEachEntryReadsEveryElement(t *testing.T) {
	kerneltest.RequireRoot(t)
	type key struct {
		Prefixlen uint32
		Session   uint32
		Addr      [4]byte
	}
	const n = 3*batchMax + 77
	for _, typ := range []ebpf.MapType{ebpf.LPMTrie, ebpf.Hash, ebpf.LRUHash} {
		t.Run(typ.String(), func(t *testing.T) {
			var flags uint32
			if typ != ebpf.LRUHash {
				flags = unix.BPF_F_NO_PREALLOC
			}
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: 12, ValueSize: 64, MaxEntries: n + 100, Flags: flags})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			count := 0
			if err := eachEntry(m, func(*key, *[64]byte) { count++ }); err != nil || count != 0 {
				t.Fatalf("empty map: %d elements, %v", count, err)
			}
			want := map[key]byte{}
			for i := range n {
				k := key{Prefixlen: 64, Session: uint32(i % 1000), Addr: [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}}
				var v [64]byte
				v[0], v[63] = byte(i), byte(i>>8)
				if err := m.Put(k, v); err != nil {
					t.Fatal(err)
				}
				want[k] = byte(i)
			}
			// What the map holds, read the slow way (an LRU hash may evict
			// before it is full: Debian 12's kernel did here).
			held := map[key]byte{}
			var k key
			var v [64]byte
			it := m.Iterate()
			for it.Next(&k, &v) {
				if w, ok := want[k]; !ok || v[0] != w {
					t.Fatalf("Iterate: %v: value %d, want %d (written: %v)", k, v[0], w, ok)
				}
				held[k] = v[0]
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			if typ != ebpf.LRUHash && len(held) != n {
				t.Fatalf("Iterate read %d elements of %d", len(held), n)
			}
			want = held
			seen := map[key]bool{}
			err = eachEntry(m, func(k *key, v *[64]byte) {
				if seen[*k] {
					t.Errorf("%v read twice", *k)
				}
				seen[*k] = true
				if w, ok := want[*k]; !ok || v[0] != w {
					t.Errorf("%v: value %d, want %d (written: %v)", *k, v[0], w, ok)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(seen) != len(held) {
				t.Fatalf("read %d elements of the %d the map holds", len(seen), len(held))
			}
		})
	}
}
