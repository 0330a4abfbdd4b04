package boundary

// Lazy start (issue 21, scale): a session's holder, and with it its PID,
// IPC, cgroup and mount namespaces, exists only once an operation needs
// them. Create and Adopt of a session without a holder record the session
// (its cgroup, uid, and the view spec as grants and the workspace change
// it) and start nothing; an idle session costs no process and no
// namespace (this host allows 96,362 cgroup namespaces in all,
// user.max_cgroup_namespaces, and each holder costs kernel memory).
//
// What needs the session's namespaces, and so starts the holder:
//
//   - Launch and Prepare (every process entering the session: run, exec,
//     attach, the shims of agent/procs),
//   - OpenFile and WriteFile (the files API works in the session's mount
//     namespace as its uid),
//   - CheckPrograms, SetProcess and ProgramFiles (a process grant
//     resolves its programs in the session's view; the exec gate marks the
//     view's mounts and sets vm.memfd_noexec in its PID namespace).
//
// What does not: a view change (SetWorkspace, SetFiles, SeedWorkspace: the
// spec alone changes while there is no holder, and the holder's start lays
// out the whole view from it; the mounts a change adds are made detached
// and closed first, checkMounts, so a change the start could not lay out
// is refused when it is made, as on a running holder), BoundProcess (the session cgroup and its
// uid), HasMountAt (no holder: no mount), Release, ForgetPersisted.
//
// Exactly once: ensureHolder holds the holder's startMu while it starts
// it, so concurrent first operations start one holder and all use it.
// The view is laid out under viewMu, which orders it with view changes
// (started is set under it): a change that ran before is in the spec the
// start lays out, one after it sees the started holder and changes its
// mounts. The process itself starts before viewMu is taken (a start into
// a paused session waits for its thaw, and must not hold up the other
// sessions' view changes). A start whose view cannot be
// laid out kills the holder and fails the operation (fail closed: no
// process runs in a view without its masks); the next operation tries
// again.
//
// A started holder is not released when its session goes idle: the
// session's private /tmp and /dev/shm are tmpfs mounts of its mount
// namespace, and its SysV IPC objects live in its IPC namespace, with no
// process holding them; ending the holder would drop them. A release
// would have to prove all of them empty (and keep the exec gate's marks
// and vm.memfd_noexec, which are set on the namespaces, in step), which
// is not built.

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// holderFor is session name's holder record, started unless start is
// false (prebuild: queue a ruleset build after a start, for an operation
// that is not a launch).
func (b *Boundary) holderFor(name string, start, prebuild bool) (*holder, error) {
	b.mu.Lock()
	h, ok := b.holders[name]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s (no session boundary)", backend.ErrSessionNotFound, name)
	}
	if !start || !b.useNS || h.started.Load() {
		return h, nil
	}
	made, err := b.ensureHolder(name, h)
	if err != nil {
		return nil, fmt.Errorf("boundary: session %s: %w", name, err)
	}
	if made && prebuild {
		b.prebuild(name)
	}
	return h, nil
}

// startedHolder is session name's holder, started (for a launch).
func (b *Boundary) startedHolder(name string) (*holder, error) {
	return b.holderFor(name, true, false)
}

// ensureHolder starts h, session name's holder, unless it runs already,
// and lays out the session's view in its new mount namespace; made says
// this call started it.
func (b *Boundary) ensureHolder(name string, h *holder) (made bool, err error) {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	if h.started.Load() {
		return false, nil
	}
	// A holder of our own first: Release may run meanwhile, and must
	// either see no pid (nothing to kill) or the started one. Not under
	// viewMu: a start into a frozen (paused) session cgroup waits until
	// it is thawed, and must not hold up every other session's view
	// changes meanwhile; a change that runs now sees no holder and
	// changes the spec, which is read below, under viewMu.
	t := &holder{cgroup: h.cgroup, uid: h.uid}
	if err := b.startHolder(t); err != nil {
		return false, err
	}
	b.viewMu.Lock()
	defer b.viewMu.Unlock()
	h.mu.Lock()
	gone := h.gone
	if !gone {
		h.pid, h.child = t.pid, t.child
	}
	h.mu.Unlock()
	if gone {
		b.killHolder(t)
		return false, fmt.Errorf("released while its holder started: %w", unix.ESRCH)
	}
	b.mu.Lock()
	var spec ViewSpec
	if s := b.specs[name]; s != nil {
		spec = *s
	}
	delete(b.views, name)
	b.mu.Unlock()
	b.rulesets.drop(name, false)
	// A new mount namespace holds none of the view's mounts.
	if err := b.layView(name, h, &sessionView{}, spec); err != nil {
		h.mu.Lock()
		if !h.gone {
			b.killHolder(h)
			h.pid, h.child = 0, false
		}
		h.mu.Unlock()
		b.mu.Lock()
		delete(b.views, name)
		b.mu.Unlock()
		return false, fmt.Errorf("lay out the view at the holder's start: %w", err)
	}
	h.started.Store(true)
	b.holderStarts.Add(1)
	return true, nil
}

// killHolder kills and reaps h, our child (h.mu held or h not shared).
func (b *Boundary) killHolder(h *holder) {
	if h.pid > 0 && h.child {
		_ = unix.Kill(h.pid, unix.SIGKILL)
		reap(h)
	}
}

// HolderRunning says whether session name has a running holder (its
// namespaces exist); false before its first operation that needs them.
func (b *Boundary) HolderRunning(name string) (bool, error) {
	h, err := b.holderFor(name, false, false)
	if err != nil {
		return false, err
	}
	if !h.started.Load() {
		return false, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.gone, nil
}

// HolderStarts counts the holders this boundary started since New.
func (b *Boundary) HolderStarts() uint64 { return b.holderStarts.Load() }
