package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The process section (the process class) on this host: the session
// boundary's exec gate (fanotify FAN_OPEN_EXEC_PERM on the session's
// mounts, boundary/exec_linux.go) and RLIMIT_NPROC. The dataplane keeps
// each session's process entries, and whether the session is gated (it
// has held one: backend/process.go), in a pinned table (shk_proc_entries,
// no program reads it) so that a restarted agent re-arms the gate of every
// gated session before it serves; after every change of the entries and
// every revoke it derives the session's allowlist and bound from the
// entries whose handle chain is live.

const (
	procTableName = "shk_proc_entries"
	procKeySize   = 16 + backend.MaxFilePath
	procExec      = 1
	procMax       = 2
	procGate      = 3 // the session is gated (no handle)
)

func procKey(index uint32, kind byte, e backend.ProcessEntry) []byte {
	k := make([]byte, procKeySize)
	binary.LittleEndian.PutUint32(k[0:], index)
	binary.LittleEndian.PutUint32(k[4:], e.Handle.Slot)
	binary.LittleEndian.PutUint32(k[8:], e.Handle.Generation)
	k[12] = kind
	if kind == procMax {
		binary.LittleEndian.PutUint32(k[16:], e.MaxProcesses)
	} else {
		copy(k[16:], e.Exec)
	}
	return k
}

func procEntry(k []byte) (uint32, byte, backend.ProcessEntry) {
	e := backend.ProcessEntry{Handle: HandleRef{Slot: binary.LittleEndian.Uint32(k[4:]), Generation: binary.LittleEndian.Uint32(k[8:])}}
	switch k[12] {
	case procMax:
		e.MaxProcesses = binary.LittleEndian.Uint32(k[16:])
	case procExec:
		p := k[16:]
		for i, b := range p {
			if b == 0 {
				p = p[:i]
				break
			}
		}
		e.Exec = string(p)
	}
	return binary.LittleEndian.Uint32(k[0:]), k[12], e
}

func kindOf(e backend.ProcessEntry) byte {
	if e.Exec != "" {
		return procExec
	}
	return procMax
}

// openProcTable opens (or makes) the pinned table and loads it; entries of
// sessions that no longer exist, or malformed ones, are deleted.
func (d *Dataplane) openProcTable() error {
	d.procs, d.procGated = map[string][]backend.ProcessEntry{}, map[string]bool{}
	t, err := openPinnedSet(d.cfg.PinPath, procTableName, procKeySize)
	if err != nil {
		return fmt.Errorf("process entry table: %w", err)
	}
	d.procTable = t
	d.mu.Lock()
	defer d.mu.Unlock()
	return t.load(func(k []byte) bool {
		idx, kind, e := procEntry(k)
		s := d.byIndex[idx]
		switch {
		case s == nil:
			return false
		case kind == procGate:
			d.procGated[s.Name] = true
		case e.Validate() == nil:
			d.procs[s.Name] = append(d.procs[s.Name], e)
		default:
			return false
		}
		return true
	})
}

func (d *Dataplane) storeProcess(index uint32, es []backend.ProcessEntry, del bool) error {
	return storeKeys(d.procTable, es, func(e backend.ProcessEntry) []byte { return procKey(index, kindOf(e), e) }, del)
}

// checkProcess refuses what Apply could not hold, changing nothing: no
// boundary, an unknown session, a dead, approve-once or expiring handle
// (the same rules as the file view: no use-time consumption, no timer), a
// program that does not resolve in the session's view.
func (d *Dataplane) checkProcess(session string, es []backend.ProcessEntry) error {
	if len(es) == 0 {
		return nil
	}
	if d.bnd == nil || !d.report.Class(backend.ClassProcess).Level.Enforceable() {
		return fmt.Errorf("%w: process: %s", ErrNotSupported, d.report.Class(backend.ClassProcess).Reason)
	}
	d.mu.Lock()
	_, ok := d.sessions[session]
	var err error
	if ok {
		fe := make([]backend.FileEntry, len(es))
		for i, e := range es {
			fe[i] = backend.FileEntry{Path: "/", Access: backend.FileRead, Handle: e.Handle}
		}
		err = d.checkFileHandles(fe)
	}
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	if err != nil {
		return err
	}
	var progs []string
	for _, e := range es {
		if e.Exec != "" {
			progs = append(progs, e.Exec)
		}
	}
	if d.execLSMOn() {
		return d.checkExecLSM(session, progs)
	}
	return d.bnd.CheckPrograms(session, progs)
}

// applyProcess adds es to session's entries, gates it and derives its
// allowlist and bound; on failure the entries are taken back.
func (d *Dataplane) applyProcess(session string, es []backend.ProcessEntry) error {
	if len(es) == 0 {
		return nil
	}
	d.mu.Lock()
	s, ok := d.sessions[session]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	var added []backend.ProcessEntry
	for _, e := range es {
		if !slices.Contains(d.procs[session], e) {
			d.procs[session] = append(d.procs[session], e)
			added = append(added, e)
		}
	}
	wasGated := d.procGated[session]
	d.procGated[session] = true
	d.mu.Unlock()
	var err error
	if !wasGated && d.procTable != nil {
		err = d.procTable.put(procKey(s.Index, procGate, backend.ProcessEntry{}))
	}
	if err == nil {
		err = d.storeProcess(s.Index, added, false)
	}
	if err == nil {
		err = d.deriveProcess(session, false)
	}
	if err != nil {
		d.mu.Lock()
		d.procs[session] = slices.DeleteFunc(d.procs[session], func(e backend.ProcessEntry) bool { return slices.Contains(added, e) })
		d.mu.Unlock()
		// The session stays gated (fail-closed): what it held before
		// is derived again.
		return errors.Join(err, d.storeProcess(s.Index, added, true), d.deriveProcess(session, true))
	}
	return nil
}

// releaseProcess drops es from session's entries (their handles are dead).
func (d *Dataplane) releaseProcess(session string, es []backend.ProcessEntry) error {
	if len(es) == 0 {
		return nil
	}
	d.mu.Lock()
	d.procs[session] = slices.DeleteFunc(d.procs[session], func(e backend.ProcessEntry) bool { return slices.Contains(es, e) })
	s, ok := d.sessions[session]
	d.mu.Unlock()
	if !ok {
		return nil
	}
	return errors.Join(d.storeProcess(s.Index, es, true), d.deriveProcess(session, true))
}

// deriveProcess gives a gated session the allowlist and bound of its live
// entries (lenient: a program that no longer resolves is left out).
func (d *Dataplane) deriveProcess(session string, lenient bool) error {
	if d.bnd == nil {
		return nil
	}
	d.mu.Lock()
	gated := d.procGated[session]
	s, ok := d.sessions[session]
	var drops uint64
	if ok && d.execLSMOn() {
		drops = d.execDrops(s.Index)
	}
	var live []backend.ProcessEntry
	for _, e := range d.procs[session] {
		if _, err := d.chainDepth(e.Handle); err == nil {
			live = append(live, e)
		}
	}
	d.mu.Unlock()
	if !gated || !ok {
		return nil
	}
	if d.execLSMOn() {
		return d.deriveExecLSM(session, s.Index, drops, live, backend.ProcessBound(live, d.bnd.HostMaxProcs()), lenient)
	}
	var progs []string
	for _, e := range live {
		if e.Exec != "" {
			progs = append(progs, e.Exec)
		}
	}
	return d.bnd.SetProcess(session, progs, backend.ProcessBound(live, d.bnd.HostMaxProcs()), lenient)
}

// procSweep derives again, after a revoke of dead, every gated session
// holding a process entry the revoke killed (reach_linux.go).
func (d *Dataplane) procSweep(dead HandleRef) error {
	d.mu.Lock()
	names := reachedSessionsLocked(d, d.procs, d.procGated, dead, func(e backend.ProcessEntry) HandleRef { return e.Handle })
	d.mu.Unlock()
	var errs []error
	for _, n := range names {
		if err := d.deriveProcess(n, true); err != nil && !errors.Is(err, ErrSessionNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// processEntries is session's entries, for Snapshot.
func (d *Dataplane) processEntries(session string) []backend.ProcessEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.procs[session])
}

// dropProcess forgets a destroyed session's entries and gate mark; d.mu
// held.
func (d *Dataplane) dropProcessLocked(name string, index uint32) error {
	err := d.storeProcess(index, d.procs[name], true)
	if d.procGated[name] && d.procTable != nil {
		err = errors.Join(err, d.procTable.delete(procKey(index, procGate, backend.ProcessEntry{})))
	}
	delete(d.procs, name)
	delete(d.procGated, name)
	return errors.Join(err, d.dropExecLSM(index))
}

// procRow is the probe's process row.
func (d *Dataplane) procRow() backend.Strength {
	p := backend.Strength{Class: backend.ClassProcess, Level: backend.Unavailable, Mechanism: "none"}
	switch {
	case d.bnd == nil:
		p.Reason = "the session boundary is off (dataplane.Config.Boundary): sessions have no uid or mount namespace of their own to gate"
	case d.bnd.Ready() != nil:
		p.Reason = "the session boundary cannot make sessions here: " + d.bnd.Ready().Error()
	case d.execLSMOn():
		return d.execLSMRow()
	case !d.bnd.MountNS():
		p.Reason = "the session boundary runs without mount namespaces here: no session mounts to mark"
	default:
		if err := d.bnd.ExecGateReady(); err != nil {
			p.Reason = "the exec gate cannot be made here: " + err.Error()
			return p
		}
		p.Level = backend.RevocableAtNextUse
		p.Mechanism = "exec allowlist: a fanotify FAN_OPEN_EXEC_PERM mark on every mount of the session's own mount namespace (BPF LSM's bprm_check_security is not attached here: the exec_lsm fact says why; Landlock EXECUTE would be fixed at exec and would let the ELF interpreter load any file), each exec-open of a task of the session's uid answered by the agent against the files its live grants name (device and inode, resolved in the session's view, symlinks followed) or the ELF interpreter of the program the same task was just let execute; vm.memfd_noexec=2 in the session's PID namespace; max_processes: RLIMIT_NPROC of the session's uid, set on every running process and on each launch"
		p.Reason = "at next exec only: a running program is not stopped by a revoke; the first process grant gates the session for its life (before it, any program in its view runs); while the agent is down the kernel drops the marks and execs are not checked (re-armed when it opens again); a file on a mount outside the session's namespace (a descriptor passed in from the host) and a mount attached by a view change before its mark are not seen; an exec that fails after its program was let through leaves that task's next open of the program's ELF interpreter allowed; an interpreter on the list runs whatever it is given; max_processes counts the uid's tasks host-wide (RLIMIT_NPROC), and " + d.pidsMaxFact()
	}
	return p
}

// pidsMaxFact says whether a session's bound is also its cgroup's
// pids.max: only where the pids controller is on cgroup v2 (cgroup v1 is
// never written).
func (d *Dataplane) pidsMaxFact() string {
	if d.pidsOnV2() {
		return "pids.max: each session's cgroup gets the host's bound at creation (cgroup v2), lowered to a grant's max_processes"
	}
	return "pids.max: unavailable: pids on cgroup v1 (the cgroup2 hierarchy here has no pids controller)"
}

// pidsOnV2 says whether the pids controller is on the cgroup2 hierarchy.
func (d *Dataplane) pidsOnV2() bool {
	b, err := os.ReadFile(d.cfg.CgroupRoot + "/cgroup.controllers")
	return err == nil && slices.Contains(strings.Fields(string(b)), "pids")
}
