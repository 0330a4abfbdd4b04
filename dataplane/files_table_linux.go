package dataplane

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The file entries are kept in a pinned map (shk_fs_entries, beside the
// BPF maps; no program reads it), so that an agent that starts again
// finds them, derives each session's view from them and reports them in
// Snapshot: reconcile then keeps a live file grant and revokes a dead
// one, as it does with egress rules. A key is one entry: the session's
// index, the handle, the access and the path.

const (
	fsTableName = "shk_fs_entries"
	fsKeySize   = 16 + backend.MaxFilePath
)

var fsAccessCode = map[backend.FileAccess]byte{backend.FileRead: 1, backend.FileWrite: 2, backend.FileDelete: 3, backend.FileDeny: 4, backend.FilePersist: 5, backend.FilePersistSession: 6, backend.FileConnect: 7}

func fsKey(index uint32, e backend.FileEntry) []byte {
	k := make([]byte, fsKeySize)
	binary.LittleEndian.PutUint32(k[0:], index)
	binary.LittleEndian.PutUint32(k[4:], e.Handle.Slot)
	binary.LittleEndian.PutUint32(k[8:], e.Handle.Generation)
	k[12] = fsAccessCode[e.Access]
	if e.Override {
		k[13] = 1
	}
	copy(k[16:], e.Path)
	return k
}

func fsEntry(k []byte) (uint32, backend.FileEntry, bool) {
	if len(k) != fsKeySize {
		return 0, backend.FileEntry{}, false
	}
	e := backend.FileEntry{Handle: HandleRef{Slot: binary.LittleEndian.Uint32(k[4:]), Generation: binary.LittleEndian.Uint32(k[8:])}, Override: k[13] == 1}
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
	d.files, d.workspaces = map[string][]backend.FileEntry{}, map[string]*backend.Workspace{}
	t, err := openPinnedSet(d.cfg.PinPath, fsTableName, fsKeySize)
	if err != nil {
		return fmt.Errorf("file entry table: %w", err)
	}
	d.fsTable = t
	if err := d.openWorkspaceTable(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return t.load(func(k []byte) bool {
		idx, e, ok := fsEntry(k)
		s := d.byIndex[idx]
		if !ok || s == nil {
			return false
		}
		d.files[s.Name] = append(d.files[s.Name], e)
		return true
	})
}

// storeFiles adds (or with del, deletes) es of the session with index to
// the table.
func (d *Dataplane) storeFiles(index uint32, es []backend.FileEntry, del bool) error {
	return storeKeys(d.fsTable, es, func(e backend.FileEntry) []byte { return fsKey(index, e) }, del)
}

func (d *Dataplane) closeFileTable() error {
	err := d.fsTable.Close()
	d.fsTable = nil
	if d.wsTable != nil {
		err = errors.Join(err, d.wsTable.Close())
		d.wsTable = nil
	}
	return err
}

// The workspaces (Limits.Workspace) are kept in a pinned table too
// (shk_workspaces: session index -> the workspace as JSON), so that a
// restarted agent derives each session's whole view (workspace and file
// grants) at once instead of taking the workspace away until reconcile
// puts it back.

const (
	wsTableName  = "shk_workspaces"
	wsValueSize  = 8192
	wsMaxEntries = 1 << 16
)

func (d *Dataplane) openWorkspaceTable() error {
	m, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: wsTableName, Type: ebpf.Hash, KeySize: 4, ValueSize: wsValueSize, MaxEntries: wsMaxEntries, Flags: unix.BPF_F_NO_PREALLOC, Pinning: ebpf.PinByName},
		ebpf.MapOptions{PinPath: d.cfg.PinPath})
	if err != nil {
		return fmt.Errorf("workspace table: %w", err)
	}
	d.wsTable = m
	var (
		k     uint32
		v     = make([]byte, wsValueSize)
		stale []uint32
	)
	it := m.Iterate()
	d.mu.Lock()
	for it.Next(&k, &v) {
		s := d.byIndex[k]
		n := binary.LittleEndian.Uint32(v)
		var w backend.Workspace
		if s == nil || n == 0 || int(n) > wsValueSize-4 || json.Unmarshal(v[4:4+n], &w) != nil || w.Validate() != nil {
			stale = append(stale, k)
			continue
		}
		d.workspaces[s.Name] = &w
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

// storeWorkspace keeps (w nil: forgets) the workspace of the session with
// index.
func (d *Dataplane) storeWorkspace(index uint32, w *backend.Workspace) error {
	if d.wsTable == nil {
		return nil
	}
	if w == nil {
		if err := d.wsTable.Delete(index); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(w)
	if err != nil {
		return err
	}
	if len(b) > wsValueSize-4 {
		return fmt.Errorf("%w: workspace %s: %d bytes with its protected paths (at most %d)", backend.ErrInvalidSession, w.Dir, len(b), wsValueSize-4)
	}
	v := make([]byte, wsValueSize)
	binary.LittleEndian.PutUint32(v, uint32(len(b)))
	copy(v[4:], b)
	return d.wsTable.Put(index, v)
}
