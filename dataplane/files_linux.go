package dataplane

import (
	"errors"
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// The files section (fs.scope) on this host: no BPF LSM loads here, so the
// session's mount view is the enforcement (package boundary's SetFiles).
// The dataplane keeps each session's file entries; after every change of
// them, and after every revoke that kills one of them (reach_linux.go),
// it derives the view from the entries whose handle chain is live, and the
// boundary changes the mounts that differ: a write root is an idmapped
// writable bind, a deny a mask, a credential location under a grant a mask.
// A revoke stays one handle-state write; the view change that follows is
// this class's sweep (Ops.ViewSweeps), done before Revoke returns. The next open through the view fails; a
// descriptor opened before keeps working, and a process whose working
// directory is inside a revoked write root can still read there (not
// write: the mount is made read-only before it is detached).

// checkFileHandles refuses entries the view cannot hold: a handle whose
// chain is not live, an approve-once handle (no use-time hook consumes it)
// and, where a mount view holds the entries, a handle chain with a
// deadline (the view has no timer: it would outlive the deadline; the LSM
// alone checks deadlines at each use); d.mu held.
func (d *Dataplane) checkFileHandles(es []backend.FileEntry) error {
	viewHolds := d.bnd != nil
	for _, e := range es {
		if _, err := d.chainDepth(e.Handle); err != nil {
			return err
		}
		for ref, i := e.Handle, 0; !ref.IsZero() && i <= MaxChain; i++ {
			h, err := d.readHandle(ref)
			if err != nil {
				return err
			}
			if h.State == uint32(HandleOnce) {
				return fmt.Errorf("%w: %s: an approve-once handle: the mount view has no use to consume it at", ErrNotSupported, e)
			}
			if h.ExpiresNs != 0 && viewHolds {
				return fmt.Errorf("%w: %s: a handle with a deadline: the mount view would outlive it", ErrNotSupported, e)
			}
			ref = HandleRef{Slot: h.Parent, Generation: h.ParentGeneration}
		}
	}
	return nil
}

// applyFiles adds es to session's entries and changes its view; on failure
// the entries are taken back and the view derived again.
func (d *Dataplane) applyFiles(session string, es []backend.FileEntry) error {
	if len(es) == 0 {
		return nil
	}
	if d.bnd == nil && !d.lsmOn() {
		return fmt.Errorf("%w: fs.scope needs the session boundary (its mount namespace) or BPF LSM (%v)", ErrNotSupported, d.lsm.err)
	}
	var never []string
	if d.bnd != nil {
		never = d.bnd.FileNever()
	}
	if err := backend.CheckDeleteCovered(es); err != nil {
		return err
	}
	for _, e := range es {
		if d.bnd == nil && fsAccessBits(e.Access) == 0 {
			return fmt.Errorf("%w: %s: persistence and connect[] entries are mounts of the session's view, and the session boundary is off", ErrNotSupported, e)
		}
		if d.bnd != nil {
			if err := d.bnd.CheckShown(e.Path); err != nil {
				return fmt.Errorf("%w: %s: %w", backend.ErrInvalidFileEntry, e, err)
			}
		}
		if e.Access == backend.FileDeny {
			continue
		}
		if err := backend.CheckSocketEntry(e, never); err != nil {
			return err
		}
		if e.Access == backend.FileConnect {
			if err := boundary.CheckSocket(e.Path); err != nil {
				return fmt.Errorf("%w: %s: %w", backend.ErrInvalidFileEntry, e, err)
			}
			continue
		}
		if err := boundary.CheckPath(e.Path); err != nil {
			return fmt.Errorf("%w: %s: %w", backend.ErrInvalidFileEntry, e, err)
		}
	}
	d.mu.Lock()
	if _, ok := d.sessions[session]; !ok {
		d.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	if err := d.checkFileHandles(es); err != nil {
		d.mu.Unlock()
		return err
	}
	var added []backend.FileEntry
	for _, e := range es {
		if !slices.Contains(d.files[session], e) {
			d.files[session] = append(d.files[session], e)
			added = append(added, e)
		}
	}
	index := d.sessions[session].Index
	d.mu.Unlock()
	err := d.storeFiles(index, added, false)
	if err == nil {
		err = d.syncFSLSM(session)
	}
	if err == nil {
		err = d.deriveView(session)
	}
	if err != nil {
		d.mu.Lock()
		d.files[session] = slices.DeleteFunc(d.files[session], func(e backend.FileEntry) bool { return slices.Contains(added, e) })
		d.mu.Unlock()
		return errors.Join(err, d.storeFiles(index, added, true), d.syncFSLSM(session), d.deriveView(session))
	}
	return nil
}

// releaseFiles drops es from session's entries (their handles are dead:
// the view no longer shows them).
func (d *Dataplane) releaseFiles(session string, es []backend.FileEntry) error {
	if len(es) == 0 {
		return nil
	}
	d.mu.Lock()
	d.files[session] = slices.DeleteFunc(d.files[session], func(e backend.FileEntry) bool { return slices.Contains(es, e) })
	if len(d.files[session]) == 0 {
		delete(d.files, session)
	}
	s, ok := d.sessions[session]
	d.mu.Unlock()
	if !ok {
		return nil // destroyed: its entries went with it
	}
	return errors.Join(d.storeFiles(s.Index, es, true), d.syncFSLSM(session), d.deriveView(session))
}

// deriveView gives session the view its live entries make.
func (d *Dataplane) deriveView(session string) error {
	if d.bnd == nil {
		return nil
	}
	d.mu.Lock()
	var live []backend.FileEntry
	for _, e := range d.files[session] {
		if _, err := d.chainDepth(e.Handle); err == nil {
			live = append(live, e)
		}
	}
	d.mu.Unlock()
	return d.bnd.SetFiles(session, live, d.bnd.FileNever())
}

var _ backend.FileOverrides = (*Dataplane)(nil)

// SetFileOverride gives the entry e names (path, access, handle) of
// session its admin override, in the table, in the LSM's inode entries
// where it is attached, and in the view.
func (d *Dataplane) SetFileOverride(session string, e backend.FileEntry) error {
	d.mu.Lock()
	s, ok := d.sessions[session]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	es, stale, added, held := backend.SetOverride(d.files[session], e)
	if !held {
		d.mu.Unlock()
		return fmt.Errorf("%w: session %s holds no entry %s", backend.ErrInvalidFileEntry, session, e)
	}
	if len(stale) == 0 && !added {
		d.mu.Unlock()
		return nil // already so
	}
	d.files[session] = es
	index := s.Index
	d.mu.Unlock()
	// The old key first (fail-closed): a crash between the two leaves
	// neither; the restarted agent's reconcile puts the grant's entry
	// back and its Open re-derives the override from the policies.
	err := d.storeFiles(index, stale, true)
	if added {
		err = errors.Join(err, d.storeFiles(index, []backend.FileEntry{e}, false))
	}
	return errors.Join(err, d.syncFSLSM(session), d.deriveView(session))
}

// fileSweep derives again, after a revoke of dead, the view of every
// session holding a file entry the revoke killed (reach_linux.go: what
// the dead handle reached), and counts one view sweep when there was any.
func (d *Dataplane) fileSweep(dead HandleRef) error {
	if d.bnd == nil {
		return nil // no view: the LSM's handle check was the whole revoke
	}
	d.mu.Lock()
	names := reachedSessionsLocked(d, d.files, nil, dead, func(e backend.FileEntry) HandleRef { return e.Handle })
	d.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	d.ops.viewSweeps.Add(1)
	var errs []error
	for _, n := range names {
		if err := d.deriveView(n); err != nil && !errors.Is(err, ErrSessionNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// fileEntries is session's entries, for Snapshot.
func (d *Dataplane) fileEntries(session string) []backend.FileEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.files[session])
}

// fsRow is the probe's fs.scope row: the BPF LSM where it attached (over
// the mount view where there is one), else the mount view where the
// session boundary has its mount namespace, else unavailable with why.
func (d *Dataplane) fsRow(abi int, llErr error) backend.Strength {
	view := d.fsViewRow(abi, llErr)
	if d.lsmOn() {
		return d.fsLSMRow(view)
	}
	return view
}

// fsViewRow is the fs.scope row of the mount view alone.
func (d *Dataplane) fsViewRow(abi int, llErr error) backend.Strength {
	fs := backend.Strength{Class: backend.ClassFSScope, Level: backend.Unavailable, Mechanism: "none"}
	switch {
	case d.bnd == nil:
		fs.Reason = "the session boundary is off (dataplane.Config.Boundary): sessions have no mount namespace to hold a file view"
	case d.bnd.Ready() != nil:
		fs.Reason = "the session boundary cannot make sessions here: " + d.bnd.Ready().Error()
	case !d.bnd.MountNS():
		fs.Reason = "the session boundary runs without mount namespaces here (accepted weaker level): no file view to change"
	default:
		fs.Level = backend.RevocableAtNextUse
		fs.Mechanism = "the session's mount view (no BPF LSM loads here): granted write and read roots bind-mounted into the live session's mount namespace (open_tree clone, idmapped to the session's uid, attached with move_mount by a thread that joined the holder's namespace), deny entries and the credential locations under a grant masked (an empty read-only tmpfs, or a nodev /dev/null over a file) unless an entry naming one carries an admin override (never the agent's own state, policy directory and socket, nor a container runtime's socket), narrowest-wins across grants; a revoke's handle write is followed by the view change (made read-only, then detached) before Revoke returns"
		fs.Reason = "at next open only: a descriptor opened before a revoke keeps reading and writing, and while one is open for writing the kernel refuses to make the mount read-only, so relative paths from a working directory inside it keep working until the process leaves it; write implies read and delete under a root (a mount is all or nothing), and a delete[] path without its own grant's write[] over it is refused (delete apart from write needs a path_unlink/path_rename hook: BPF LSM, not loadable here); the Delta keeps delete as its own bit; reads of world-readable host files outside read[] are not refused (the host root stays visible read-only); approve-once and expiring file grants are refused (no use-time hook, no timer)"
		if llErr == nil {
			fs.Reason += fmt.Sprintf("; Landlock ABI %d is present but not yet applied as a second layer", abi)
		}
	}
	return fs
}

// persistRow is the probe's persistence row: the same mount view as
// fs.scope (fs), with a persist directory.
func (d *Dataplane) persistRow(fs backend.Strength) backend.Strength {
	p := backend.Strength{Class: backend.ClassPersistence, Level: backend.Unavailable, Mechanism: "none"}
	switch {
	case !fs.Level.Enforceable():
		p.Reason = "no file view on this host: " + fs.Reason
	case d.cfg.Boundary.PersistDir == "":
		p.Reason = "no persist directory is configured (boundary.Config.PersistDir; the daemon sets STATE_DIR/persist)"
	case d.bnd.PersistOverlay() == nil:
		p.Level = backend.RevocableAtNextUse
		p.Mechanism = "the session's mount view: each persistent path is an overlay (fsopen/fsconfig/fsmount from detached idmapped layers): the host's directory read-only as the lower layer, the session name's own directory under " + d.cfg.Boundary.PersistDir + " as the upper (keep/NAME with survives_session, kept until forgotten and reattached by the next session of the name; session/NAME otherwise, removed with the session), both shown as the session's uid; credential locations under it masked; a revoke detaches it (read-only first)"
		p.Reason = "a descriptor opened before a revoke keeps working; the host's later changes to a file the session changed are hidden by its copy"
	default:
		p.Level = backend.RevocableAtNextUse
		p.Mechanism = "the session's mount view: each persistent path is a bind mount of the session name's own directory under " + d.cfg.Boundary.PersistDir + " (keep/NAME with survives_session, kept until forgotten; session/NAME otherwise, removed with the session), idmapped to the session's uid; a revoke detaches it (read-only first)"
		p.Reason = "no overlay here (" + d.bnd.PersistOverlay().Error() + "): the path's own host content is hidden under the mount, not merged; a descriptor opened before a revoke keeps working"
	}
	return p
}

var _ backend.PersistentPaths = (*Dataplane)(nil)

// ForgetPersisted removes what sessions named name kept (the boundary's
// keep/NAME); refused while a session of the name exists.
func (d *Dataplane) ForgetPersisted(name string) error {
	if d.bnd == nil {
		return fmt.Errorf("%w: persistence needs the session boundary", ErrNotSupported)
	}
	d.mu.Lock()
	_, live := d.sessions[name]
	d.mu.Unlock()
	if live {
		return fmt.Errorf("%w: session %s exists: end it first", backend.ErrSessionExists, name)
	}
	return d.bnd.ForgetPersisted(name)
}
