package dataplane

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The process class's exec allowlist in the kernel where BPF LSM is active
// (bpf/exec.bpf.c, its own object shkexec, so that a host where LSM
// programs cannot load still loads the main object and gates execs with
// the boundary's fanotify group). Where it is attached, a gated session's
// allowlist is its entries in shk_exec_files ((session index, dev, ino) of
// each program its live grants name, resolved in the session's view ->
// the grants' handles) and its mark in shk_exec_gated, both pinned with
// the program's link: the kernel checks every exec of the session's tasks
// against them with the shared handle check, so a revoke is the one
// handle write, and an agent that is down leaves the gate as it was.
// deriveProcess writes the difference after every change and sweep.

// execLSMLink is the pinned link's name (an "lsm_" name: attach's
// obsolete-link cleanup leaves it alone).
const execLSMLink = "lsm_bprm_check_security"

// execLSMState is the exec LSM of a dataplane: nil objects when it is not
// attached (err says why).
type execLSMState struct {
	mu    sync.Mutex
	objs  *shkexecObjects
	link  link.Link
	err   error
	files map[uint32]map[shkexecShkExecKey]shkexecShkExecValue // per session index: its entries in the kernel
	gated map[uint32]bool                                      // session indices marked in shk_exec_gated
	drops map[uint32]uint64                                    // per session index: its drops (a derive that raced one writes nothing)
}

// openExecLSM loads and attaches the exec LSM, sharing the main object's
// session, handle, counter, statistics and event maps, and reads what a
// previous agent left in its pinned maps (they stay in force meanwhile:
// the new link replaces the old one after it is attached). It runs before
// the boundary adopts the sessions, whose deriveProcess then writes the
// difference; finishExecLSM drops what no gated session holds. A failure
// is kept in d.xlsm.err: the fanotify gate is the mechanism, and the probe
// says so.
func (d *Dataplane) openExecLSM() {
	x := &d.xlsm
	x.files, x.gated, x.drops = map[uint32]map[shkexecShkExecKey]shkexecShkExecValue{}, map[uint32]bool{}, map[uint32]uint64{}
	if d.cfg.noAttach {
		x.err = errors.New("the dataplane was opened without attaching programs")
		return
	}
	if err := d.loadExecLSM(); err != nil {
		x.err = lsmLoadError(err)
		if x.link != nil {
			x.link.Unpin()
		}
		d.closeExecLSM()
	}
}

func (d *Dataplane) loadExecLSM() error {
	x := &d.xlsm
	spec, err := loadShkexec()
	if err != nil {
		return fmt.Errorf("load exec LSM spec: %w", err)
	}
	objs := &shkexecObjects{}
	own := map[string]uint32{"shk_exec_files": pinnedSetEntries, "shk_exec_gated": d.cfg.MaxSessions, "shk_exec_on": 0}
	if err := d.loadLSMObject(spec, own, objs); err != nil {
		return fmt.Errorf("load exec LSM program: %w", err)
	}
	x.objs = objs
	l, err := d.attachLSM(objs.ShkBprmCheck, "bprm_check_security", execLSMLink)
	if l != nil {
		x.link = l
	}
	if err != nil {
		return err
	}
	// What a previous agent wrote: the difference is written from it.
	var (
		k shkexecShkExecKey
		v shkexecShkExecValue
	)
	it := objs.ShkExecFiles.Iterate()
	for it.Next(&k, &v) {
		if x.files[k.Session] == nil {
			x.files[k.Session] = map[shkexecShkExecKey]shkexecShkExecValue{}
		}
		x.files[k.Session][k] = v
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read shk_exec_files: %w", err)
	}
	return eachArray(objs.ShkExecGated, func(idx uint32, on *uint32) {
		if *on != 0 {
			x.gated[idx] = true
		}
	})
}

// finishExecLSM (after the boundary adopted the sessions) drops the
// entries and marks of sessions that are not gated now (gone while no
// agent ran).
func (d *Dataplane) finishExecLSM() error {
	if !d.execLSMOn() {
		return nil
	}
	d.mu.Lock()
	keep := map[uint32]bool{}
	for n := range d.procGated {
		if s, ok := d.sessions[n]; ok {
			keep[s.Index] = true
		}
	}
	d.mu.Unlock()
	x := &d.xlsm
	x.mu.Lock()
	defer x.mu.Unlock()
	var errs []error
	for idx := range x.files {
		if !keep[idx] {
			errs = append(errs, d.writeExecLSMLocked(idx, nil, false))
		}
	}
	for idx := range x.gated {
		if !keep[idx] {
			errs = append(errs, d.writeExecLSMLocked(idx, nil, false))
		}
	}
	return errors.Join(append(errs, x.objs.ShkExecOn.Put(uint32(0), uint32(len(x.gated))))...)
}

// execLSMOn says whether the exec LSM is attached.
func (d *Dataplane) execLSMOn() bool { return d.xlsm.objs != nil && d.xlsm.link != nil }

func (d *Dataplane) closeExecLSM() error {
	x := &d.xlsm
	var errs []error
	if x.link != nil {
		errs = append(errs, x.link.Close())
		x.link = nil
	}
	if x.objs != nil {
		errs = append(errs, x.objs.Close())
		x.objs = nil
	}
	return errors.Join(errs...)
}

// checkExecLSM resolves the programs of es in session's view, changing
// nothing (checkProcess where the exec LSM is attached).
func (d *Dataplane) checkExecLSM(session string, progs []string) error {
	_, err := d.bnd.ProgramFiles(session, progs, false)
	return err
}

// deriveExecLSM writes gated session's allowlist from its live entries (the
// difference from what the kernel holds), marks it gated, and sets its
// bound.
// drops is execDrops(index), read with the session's lookup.
func (d *Dataplane) deriveExecLSM(session string, index uint32, drops uint64, live []backend.ProcessEntry, bound uint32, lenient bool) error {
	var progs []string
	var refs []HandleRef
	for _, e := range live {
		if e.Exec != "" {
			progs = append(progs, e.Exec)
			refs = append(refs, e.Handle)
		}
	}
	files, err := d.bnd.ProgramFiles(session, progs, lenient)
	if err != nil {
		return err
	}
	want := map[shkexecShkExecKey]shkexecShkExecValue{}
	for i, f := range files {
		if !f.OK {
			continue
		}
		k := shkexecShkExecKey{Session: index, Dev: f.Dev, Ino: f.Ino}
		v := want[k]
		r := shkexecShkExecRule{Handle: refs[i].Slot, Generation: refs[i].Generation}
		dup := false
		for _, have := range v.Rules[:v.Nrules] {
			dup = dup || have == r
		}
		if dup {
			continue
		}
		if int(v.Nrules) == len(v.Rules) {
			if lenient {
				continue
			}
			return fmt.Errorf("%w: exec %s: more than %d grants name this file", backend.ErrInvalidProcessEntry, f.Path, len(v.Rules))
		}
		v.Rules[v.Nrules] = r
		v.Nrules++
		want[k] = v
	}
	d.xlsm.mu.Lock()
	if d.xlsm.drops[index] != drops {
		// The session was destroyed meanwhile: its index may be
		// another session's now.
		d.xlsm.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	err = d.writeExecLSMLocked(index, want, true)
	d.xlsm.mu.Unlock()
	return errors.Join(err, d.bnd.BoundProcess(session, bound))
}

// writeExecLSMLocked makes the kernel hold exactly want for session index,
// gated or not, writing only what differs; d.xlsm.mu held.
func (d *Dataplane) writeExecLSMLocked(index uint32, want map[shkexecShkExecKey]shkexecShkExecValue, gated bool) error {
	x := &d.xlsm
	have := x.files[index]
	var errs []error
	for k, v := range want {
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if err := x.objs.ShkExecFiles.Put(k, v); err != nil {
			errs = append(errs, fmt.Errorf("write exec entry: %w", err))
			continue
		}
		d.ops.execWrites.Add(1)
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			if err := x.objs.ShkExecFiles.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
				continue
			}
			d.ops.execWrites.Add(1)
		}
	}
	if len(want) > 0 {
		x.files[index] = want
	} else {
		delete(x.files, index)
	}
	if gated != x.gated[index] {
		on := uint32(0)
		if gated {
			on = 1
		}
		// Gated after its entries are written, ungated after they went.
		if err := x.objs.ShkExecGated.Put(index, on); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if gated {
			x.gated[index] = true
		} else {
			delete(x.gated, index)
		}
		if err := x.objs.ShkExecOn.Put(uint32(0), uint32(len(x.gated))); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// execDrops is how often session index was dropped (read under d.mu with
// the session's lookup, so a drop after it shows).
func (d *Dataplane) execDrops(index uint32) uint64 {
	d.xlsm.mu.Lock()
	defer d.xlsm.mu.Unlock()
	return d.xlsm.drops[index]
}

// dropExecLSM forgets a destroyed session's entries and mark.
func (d *Dataplane) dropExecLSM(index uint32) error {
	if !d.execLSMOn() {
		return nil
	}
	d.xlsm.mu.Lock()
	defer d.xlsm.mu.Unlock()
	d.xlsm.drops[index]++
	return d.writeExecLSMLocked(index, nil, false)
}

// ExecLSMEntries counts the exec entries the kernel holds for session (for
// tests and status); 0 where the exec LSM is not attached.
func (d *Dataplane) ExecLSMEntries(session string) int {
	d.mu.Lock()
	s, ok := d.sessions[session]
	d.mu.Unlock()
	if !ok {
		return 0
	}
	d.xlsm.mu.Lock()
	defer d.xlsm.mu.Unlock()
	return len(d.xlsm.files[s.Index])
}

// execLSMRow is the probe's process row where the exec LSM is attached.
func (d *Dataplane) execLSMRow() backend.Strength {
	return backend.Strength{
		Class: backend.ClassProcess, Level: backend.RevocableAtNextUse,
		Mechanism: "exec allowlist: BPF LSM bprm_check_security keyed by session (cgroup id) and by the inode (the kernel's device and inode number) of each program the session's live grants name, resolved in the session's view when they are applied (symlinks followed), checked at every exec of a task of the session (the program and each script interpreter of its #! chain) with the grant's caretaker handle: a revoke is the one handle write, and the gate holds while the agent is down (pinned maps and link); max_processes: RLIMIT_NPROC of the session's uid, set on every running process and on each launch",
		Reason:    "at next exec only: a running program is not stopped by a revoke; the first process grant gates the session for its life (before it, any program in its view runs); the ELF interpreter (ld.so) of a listed program is loaded by the kernel without an exec check, so ld.so run directly is refused unless it is listed itself, and an interpreter on the list (a shell, python) runs whatever it is given; a memfd or any copy is another inode, never listed; a program on btrfs or overlayfs is refused at grant time (their stat numbers are not the kernel inode's); a listed file rewritten in place, or its inode number reused by the host after it is deleted, keeps the entry; tasks of uid 0 are not checked (the agent's launch step; a session's tasks run as its uid under no_new_privs); max_processes counts the uid's tasks host-wide (RLIMIT_NPROC), and " + d.pidsMaxFact(),
	}
}
