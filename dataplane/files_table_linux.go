package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The file entries are kept in a pinned map (shk_fs_entries, beside the
// BPF maps; no program reads it), so that an agent that starts again
// finds them, derives each session's view from them and reports them in
// Snapshot: reconcile then keeps a live file grant and revokes a dead
// one, as it does with egress rules. A key is one entry: the session's
// index, the handle, the access and the path.

const (
	fsTableName    = "shk_fs_entries"
	fsTableEntries = 1 << 16
	fsKeySize      = 16 + backend.MaxFilePath
)

var fsAccessCode = map[backend.FileAccess]byte{backend.FileRead: 1, backend.FileWrite: 2, backend.FileDelete: 3, backend.FileDeny: 4}

func fsKey(index uint32, e backend.FileEntry) []byte {
	k := make([]byte, fsKeySize)
	binary.LittleEndian.PutUint32(k[0:], index)
	binary.LittleEndian.PutUint32(k[4:], e.Handle.Slot)
	binary.LittleEndian.PutUint32(k[8:], e.Handle.Generation)
	k[12] = fsAccessCode[e.Access]
	copy(k[16:], e.Path)
	return k
}

func fsEntry(k []byte) (uint32, backend.FileEntry, bool) {
	if len(k) != fsKeySize {
		return 0, backend.FileEntry{}, false
	}
	e := backend.FileEntry{Handle: HandleRef{Slot: binary.LittleEndian.Uint32(k[4:]), Generation: binary.LittleEndian.Uint32(k[8:])}}
	for a, c := range fsAccessCode {
		if c == k[12] {
			e.Access = a
		}
	}
	p := k[16:]
	for i, b := range p {
		if b == 0 {
			p = p[:i]
			break
		}
	}
	e.Path = string(p)
	return binary.LittleEndian.Uint32(k[0:]), e, e.Validate() == nil
}

// openFileTable opens (or makes) the pinned table and loads its entries
// into d.files, by session; entries of sessions that no longer exist, or
// malformed ones, are deleted.
func (d *Dataplane) openFileTable() error {
	m, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: fsTableName, Type: ebpf.Hash, KeySize: fsKeySize, ValueSize: 1, MaxEntries: fsTableEntries, Pinning: ebpf.PinByName},
		ebpf.MapOptions{PinPath: d.cfg.PinPath})
	if err != nil {
		return fmt.Errorf("file entry table: %w", err)
	}
	d.fsTable = m
	var stale [][]byte
	k := make([]byte, fsKeySize)
	var v [1]byte
	it := m.Iterate()
	d.mu.Lock()
	for it.Next(&k, &v) {
		idx, e, ok := fsEntry(k)
		s := d.byIndex[idx]
		if !ok || s == nil {
			stale = append(stale, append([]byte(nil), k...))
			continue
		}
		d.files[s.Name] = append(d.files[s.Name], e)
	}
	d.mu.Unlock()
	err = it.Err()
	for _, k := range stale {
		if derr := m.Delete(k); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
			err = errors.Join(err, derr)
		}
	}
	return err
}

// storeFiles adds (or with del, deletes) es of the session with index to
// the table.
func (d *Dataplane) storeFiles(index uint32, es []backend.FileEntry, del bool) error {
	if d.fsTable == nil {
		return nil
	}
	var errs []error
	for _, e := range es {
		k := fsKey(index, e)
		if del {
			if err := d.fsTable.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		if err := d.fsTable.Put(k, []byte{1}); err != nil {
			errs = append(errs, fmt.Errorf("store %s: %w", e, err))
		}
	}
	return errors.Join(errs...)
}

func (d *Dataplane) closeFileTable() error {
	if d.fsTable == nil {
		return nil
	}
	err := d.fsTable.Close()
	d.fsTable = nil
	return err
}
