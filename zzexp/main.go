package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

type key struct {
	Prefixlen uint32
	Session   uint32
	Addr      [4]byte
}

func main() {
	const n = 200000
	for _, typ := range []ebpf.MapType{ebpf.LPMTrie, ebpf.Hash} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: 12, ValueSize: 64, MaxEntries: n, Flags: 1 /* NO_PREALLOC */})
		if err != nil {
			panic(err)
		}
		v := make([]byte, 64)
		for i := 0; i < n; i++ {
			k := key{Prefixlen: 64, Session: uint32(i % 1000), Addr: [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}}
			if err := m.Put(k, v); err != nil {
				panic(err)
			}
		}
		t := time.Now()
		it := m.Iterate()
		var k key
		c := 0
		for it.Next(&k, &v) {
			c++
		}
		fmt.Printf("%v iterate %d: %v\n", typ, c, time.Since(t))
		t = time.Now()
		keys := make([]key, 4096)
		vals := make([][64]byte, 4096)
		var cur ebpf.MapBatchCursor
		c = 0
		for {
			got, err := m.BatchLookup(&cur, keys, vals, nil)
			c += got
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			if err != nil {
				fmt.Printf("%v batch: %v\n", typ, err)
				break
			}
		}
		fmt.Printf("%v batch %d: %v\n", typ, c, time.Since(t))
		m.Close()
	}
}
