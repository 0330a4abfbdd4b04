package dataplane

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// fs.scope in the kernel where BPF LSM is active (bpf/files.bpf.c, its own
// object shkfs, so that a host where LSM programs cannot load still loads
// the main object). Open tries to load and attach it and keeps why not;
// the probe row says which enforces fs.scope. Where it is attached, every
// read, write, delete and deny entry of a session is also an inode entry
// (shk_fs_inodes: (session, dev, ino) of the entry's path, resolved when the
// grant is made, -> its rules: handle and access bits), checked by the LSM
// hooks at every open, read, write, create, link, delete and rename of the
// session's processes with the shared handle check: a revoke is the one
// handle write, and the next use fails, on descriptors already open too.

// fsLSMHooks are the LSM programs and the names of their pinned links.
var fsLSMHooks = []struct {
	name string
	prog func(*shkfsPrograms) *ebpf.Program
}{
	{"lsm_file_open", func(p *shkfsPrograms) *ebpf.Program { return p.ShkFileOpen }},
	{"lsm_file_permission", func(p *shkfsPrograms) *ebpf.Program { return p.ShkFilePermission }},
	{"lsm_path_truncate", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathTruncate }},
	{"lsm_path_mknod", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathMknod }},
	{"lsm_path_mkdir", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathMkdir }},
	{"lsm_path_symlink", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathSymlink }},
	{"lsm_path_link", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathLink }},
	{"lsm_path_unlink", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathUnlink }},
	{"lsm_path_rmdir", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathRmdir }},
	{"lsm_path_rename", func(p *shkfsPrograms) *ebpf.Program { return p.ShkPathRename }},
}

// FSLSMHooks names the LSM hooks fs.scope attaches where BPF LSM is active.
const FSLSMHooks = "file_open, file_permission, path_truncate, path_mknod, path_mkdir, path_symlink, path_link, path_unlink, path_rmdir, path_rename"

// fsLSMLinkPin says whether a pinned link's name is one of fs.scope's LSM
// links (attach's obsolete-link cleanup leaves them to openFSLSM).
func fsLSMLinkPin(name string) bool { return strings.HasPrefix(name, "lsm_") }

// lsmState is the LSM layer of a dataplane: nil objects when it is not
// attached (err says why).
type lsmState struct {
	objs  *shkfsObjects
	links []link.Link
	err   error
	keys  map[uint32]map[shkfsShkFsKey]bool // per session index: its inode entries in the kernel
	on    map[uint32]bool                   // sessions whose shk_fs_sessions record is on
	never []string                          // credential locations: a deny rule under every grant covering one
	fixed []string                          // those of never no admin override opens
}

// openFSLSM loads the fs.scope LSM object, sharing the main object's
// session, handle, counter, statistics and event maps, and attaches each
// hook (a pinned link of a previous agent is replaced after the new one
// is attached). Any failure is kept in d.lsm.err, not returned: the
// mount view stays the enforcement, and the probe says so.
func (d *Dataplane) openFSLSM() {
	d.lsm = lsmState{keys: map[uint32]map[shkfsShkFsKey]bool{}, on: map[uint32]bool{}}
	if d.bnd != nil {
		d.lsm.never, d.lsm.fixed = d.bnd.FileNever(), d.bnd.FileNeverFixed()
	} else {
		d.lsm.never = boundary.DefaultFileNever()
	}
	if d.cfg.noAttach {
		d.lsm.err = errors.New("the dataplane was opened without attaching programs")
		return
	}
	if err := d.loadFSLSM(); err != nil {
		d.lsm.err = lsmLoadError(err)
		// What this call attached and pinned goes: the probe says the
		// LSM is not enforcing, so nothing of it may be.
		for _, l := range d.lsm.links {
			l.Unpin()
		}
		d.closeFSLSM()
	}
}

func (d *Dataplane) loadFSLSM() error {
	spec, err := loadShkfs()
	if err != nil {
		return fmt.Errorf("load LSM spec: %w", err)
	}
	objs := &shkfsObjects{}
	own := map[string]uint32{"shk_fs_inodes": pinnedSetEntries, "shk_fs_sessions": d.cfg.MaxSessions, "shk_fs_on": 0}
	if err := d.loadLSMObject(spec, own, objs); err != nil {
		return fmt.Errorf("load LSM programs: %w", err)
	}
	d.lsm.objs = objs
	for _, h := range fsLSMHooks {
		l, err := d.attachLSM(h.prog(&objs.shkfsPrograms), strings.TrimPrefix(h.name, "lsm_"), h.name)
		if l != nil {
			d.lsm.links = append(d.lsm.links, l)
		}
		if err != nil {
			return err
		}
	}
	// Write each session's entries from the file table first, then drop
	// what no session of this agent holds (a session gone while no agent
	// ran): an agent adopting pinned maps leaves no moment without them.
	d.mu.Lock()
	names := make([]string, 0, len(d.files))
	for n := range d.files {
		names = append(names, n)
	}
	d.mu.Unlock()
	for _, n := range names {
		if err := d.syncFSLSM(n); err != nil {
			return fmt.Errorf("restore the inode entries of %s: %w", n, err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var (
		k     shkfsShkFsKey
		v     shkfsShkFsValue
		stale []shkfsShkFsKey
	)
	it := objs.ShkFsInodes.Iterate()
	for it.Next(&k, &v) {
		if !d.lsm.keys[k.Session][k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read shk_fs_inodes: %w", err)
	}
	for _, k := range stale {
		if err := objs.ShkFsInodes.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	var off []uint32
	err = eachArray(objs.ShkFsSessions, func(idx uint32, rec *shkfsShkFsSession) {
		if rec.On != 0 && !d.lsm.on[idx] {
			off = append(off, idx)
		}
	})
	if err != nil {
		return fmt.Errorf("read shk_fs_sessions: %w", err)
	}
	for _, idx := range off {
		if err := objs.ShkFsSessions.Put(idx, shkfsShkFsSession{}); err != nil {
			return err
		}
	}
	return objs.ShkFsOn.Put(uint32(0), uint32(len(d.lsm.on)))
}

// lsmOn says whether the LSM programs are attached.
func (d *Dataplane) lsmOn() bool { return d.lsm.objs != nil && len(d.lsm.links) == len(fsLSMHooks) }

func (d *Dataplane) closeFSLSM() error {
	var errs []error
	for _, l := range d.lsm.links {
		errs = append(errs, l.Close())
	}
	d.lsm.links = nil
	if d.lsm.objs != nil {
		errs = append(errs, d.lsm.objs.Close())
		d.lsm.objs = nil
	}
	return errors.Join(errs...)
}

// fsAccessBits is the kernel's access of an entry; 0 for the entries the
// LSM does not key (persist and connect: mounts of the view only).
func fsAccessBits(a backend.FileAccess) uint32 {
	switch a {
	case backend.FileRead:
		return 1 // SHK_FS_READ
	case backend.FileWrite:
		return 2 // SHK_FS_WRITE
	case backend.FileDelete:
		return 4 // SHK_FS_DELETE
	case backend.FileDeny:
		return fsDenyBit
	}
	return 0
}

const fsDenyBit = 8 // SHK_FS_DENY

const (
	fsOutsideAll  = 7 // SHK_FS_ALL: the mount view decides outside the entries
	fsOutsideRead = 1 // SHK_FS_READ: nothing else confines writes
)

// Filesystems whose stat answers another device or inode number than the
// kernel's inode has (btrfs subvolumes' anonymous devices, overlayfs's
// inode numbers): an entry there would never match.
var fsInodeMismatch = map[int64]string{0x9123683e: "btrfs", 0x794c7630: "overlayfs"}

// fsInode resolves p (no symbolic link at its end: boundary.CheckPath
// refused those in the path) to the kernel's (dev, ino).
func fsInode(p string) (uint32, uint64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return 0, 0, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return 0, 0, errors.New("a symbolic link")
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(p, &sf); err != nil {
		return 0, 0, err
	}
	if n, bad := fsInodeMismatch[int64(sf.Type)]; bad {
		return 0, 0, fmt.Errorf("on %s, whose stat numbers are not the kernel inode's: the LSM could not match it", n)
	}
	// The kernel's dev_t: major << 20 | minor.
	return unix.Major(st.Dev)<<20 | unix.Minor(st.Dev), st.Ino, nil
}

// syncFSLSM writes session's inode entries from its file entries (all of
// them, live or not: the kernel checks each rule's handle; fsLSMRules) and
// deletes the ones it no longer has. No-op where the LSM is not attached.
func (d *Dataplane) syncFSLSM(session string) error {
	if !d.lsmOn() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[session]
	if !ok {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	want, err := fsLSMRules(s.Index, d.files[session], d.lsm.never, d.lsm.fixed)
	if err != nil {
		return err
	}
	return d.writeFSLSM(s.Index, want)
}

// writeFSLSM makes the kernel hold exactly want for session index; d.mu
// held.
func (d *Dataplane) writeFSLSM(index uint32, want map[shkfsShkFsKey]*shkfsShkFsValue) error {
	m := d.lsm.objs
	var errs []error
	for k, v := range want {
		if err := m.ShkFsInodes.Put(k, v); err != nil {
			errs = append(errs, fmt.Errorf("write inode entry: %w", err))
		}
	}
	for k := range d.lsm.keys[index] {
		if want[k] == nil {
			if err := m.ShkFsInodes.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
	}
	keys := map[shkfsShkFsKey]bool{}
	for k := range want {
		keys[k] = true
	}
	d.lsm.keys[index] = keys
	rec := shkfsShkFsSession{}
	if len(want) > 0 {
		rec.On, rec.Outside = 1, fsOutsideRead
		if d.bnd != nil && d.bnd.MountNS() {
			rec.Outside = fsOutsideAll
		}
	}
	if err := m.ShkFsSessions.Put(index, rec); err != nil {
		errs = append(errs, err)
	}
	if rec.On == 1 {
		d.lsm.on[index] = true
	} else {
		delete(d.lsm.on, index)
		delete(d.lsm.keys, index)
	}
	if err := m.ShkFsOn.Put(uint32(0), uint32(len(d.lsm.on))); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// dropFSLSM deletes a destroyed session's inode entries; d.mu held.
func (d *Dataplane) dropFSLSM(index uint32) error {
	if !d.lsmOn() {
		return nil
	}
	return d.writeFSLSM(index, nil)
}

// FSInodeEntries counts the inode entries the LSM holds for session (for
// tests and status); 0 where the LSM is not attached.
func (d *Dataplane) FSInodeEntries(session string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[session]
	if !ok {
		return 0
	}
	return len(d.lsm.keys[s.Index])
}

// fsLSMRow is the probe's fs.scope row where the LSM is attached.
func (d *Dataplane) fsLSMRow(view backend.Strength) backend.Strength {
	fs := backend.Strength{Class: backend.ClassFSScope, Level: backend.RevocableInKernel}
	fs.Mechanism = "BPF LSM (" + FSLSMHooks + ") keyed by session (cgroup id) and by the inode of each read, write, delete and deny root (resolved when the grant is made), checked at every open, read, write, create, link, delete and rename with the grant's caretaker handle: a revoke is the one handle write, and descriptors opened before it stop reading and writing; the nearest covering entry with a live rule decides (at most 16 dentries walked up; deeper with no entry: refused); each credential location at or below a granted root is a deny rule under the grant's handle"
	fs.Reason = "an entry covers its own filesystem only (a filesystem mounted below a root is outside it); roots on btrfs or overlayfs are refused (their stat numbers are not the kernel inode's); a root deleted and its inode number reused by the host would carry the entry; devices, FIFOs and sockets are not checked (the device classes, connect[]); chmod, chown and xattrs are not checked; a memory mapping made before a revoke keeps its pages (page faults pass no hook)"
	if view.Level.Enforceable() {
		fs.Mechanism += "; outside every entry the session's mount view decides, as it does without BPF LSM: " + view.Mechanism
	} else {
		fs.Mechanism += "; outside every entry a session reads but does not write, create or delete (no session mount view here)"
		fs.Reason += "; without the session boundary persistence and connect[] entries are refused"
	}
	return fs
}
