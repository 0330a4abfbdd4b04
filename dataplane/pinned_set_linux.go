package dataplane

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// pinnedSet is a set of fixed-size keys in a pinned BPF hash map that no
// program reads: the dataplane's memory of entries that must outlive the
// agent (the file entries, shk_fs_entries; the process entries,
// shk_proc_entries). A class encodes an entry (its session's index, its
// handle, what it holds) as one key; a restarted agent loads the keys
// back and deletes those whose session is gone or that do not decode.
type pinnedSet struct {
	m       *ebpf.Map
	keySize int
}

// pinnedSetEntries bounds each set: 65,536 entries, taken as they come
// (BPF_F_NO_PREALLOC), not up front.
const pinnedSetEntries = 1 << 16

// openPinnedSet opens (or makes) the set name pinned under pinPath.
func openPinnedSet(pinPath, name string, keySize int) (*pinnedSet, error) {
	m, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: name, Type: ebpf.Hash, KeySize: uint32(keySize), ValueSize: 1, MaxEntries: pinnedSetEntries, Flags: unix.BPF_F_NO_PREALLOC, Pinning: ebpf.PinByName},
		ebpf.MapOptions{PinPath: pinPath})
	if err != nil {
		return nil, err
	}
	return &pinnedSet{m: m, keySize: keySize}, nil
}

// load calls keep with every key (a buffer reused between calls: keep
// copies what it holds on to); the keys keep refuses are deleted.
func (p *pinnedSet) load(keep func(k []byte) bool) error {
	var stale [][]byte
	k := make([]byte, p.keySize)
	var v [1]byte
	it := p.m.Iterate()
	for it.Next(&k, &v) {
		if !keep(k) {
			stale = append(stale, slices.Clone(k))
		}
	}
	err := it.Err()
	for _, k := range stale {
		err = errors.Join(err, p.delete(k))
	}
	return err
}

func (p *pinnedSet) put(k []byte) error {
	return p.m.Put(k, []byte{1})
}

// delete removes k; a key that is not there is not an error.
func (p *pinnedSet) delete(k []byte) error {
	if err := p.m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// store adds (or with del, deletes) the keys of es, encoded by key; a nil
// set stores nothing (a dataplane without the class's table).
func storeKeys[E fmt.Stringer](p *pinnedSet, es []E, key func(E) []byte, del bool) error {
	if p == nil {
		return nil
	}
	var errs []error
	for _, e := range es {
		if del {
			errs = append(errs, p.delete(key(e)))
		} else if err := p.put(key(e)); err != nil {
			errs = append(errs, fmt.Errorf("store %s: %w", e, err))
		}
	}
	return errors.Join(errs...)
}

func (p *pinnedSet) Close() error {
	if p == nil {
		return nil
	}
	return p.m.Close()
}
