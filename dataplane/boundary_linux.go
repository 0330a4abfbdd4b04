package dataplane

import (
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// The session boundary (package boundary): per-session uid, namespaces and
// the launcher. On when Config.Boundary is set (the daemon always sets it);
// without it sessions are only cgroups and StartIn starts processes as
// nobody, which tests of the egress hooks alone still use.

// openBoundary opens the boundary and finds the holder of every session
// Open adopted (their uids follow from their indices, read back from the
// pinned maps); a session with none (never launched into, or its holder
// died) is recorded without one, and starts one at its next launch. A
// session whose boundary cannot be adopted keeps none: Launch refuses it.
func (d *Dataplane) openBoundary() error {
	if d.cfg.Boundary == nil {
		return nil
	}
	b, err := boundary.New(*d.cfg.Boundary, d.cfg.MaxSessions)
	if err != nil {
		return err
	}
	d.bnd = b
	b.OnExecDenial(d.execDenied)
	var errs []string
	for name, s := range d.sessions {
		if err := b.Adopt(name, s.Path, s.Index); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		// The view is derived again from the stored workspace and file
		// entries of live handles: a mount an earlier agent left that
		// they do not account for goes (fail-closed).
		if w := d.workspaces[name]; w != nil {
			b.SeedWorkspace(name, *w)
		}
		if err := d.deriveView(name); err != nil {
			errs = append(errs, err.Error())
		}
		// A gated session's exec gate and bound are armed again before
		// the agent serves (the kernel dropped the last agent's marks).
		if err := d.deriveProcess(name, true); err != nil {
			errs = append(errs, err.Error())
		}
	}
	sort.Strings(errs)
	d.bndAdoptErr = strings.Join(errs, "; ")
	return nil
}

// boundaryReport replaces the report's boundary rows with what the
// boundary probed, and adds its facts. Without a boundary it returns false
// (the report keeps the row saying every session shares one uid).
func (d *Dataplane) boundaryReport(r *backend.Report) bool {
	if d.bnd == nil {
		return false
	}
	r.Boundary = d.bnd.Report()
	if err := d.bnd.Ready(); err != nil {
		r.Facts["session_boundary"] = err.Error()
	} else {
		r.Facts["session_boundary"] = "complete"
	}
	r.Facts["session_launcher"] = d.bnd.Launcher()
	r.Facts["seccomp_filter_instructions"] = fmt.Sprint(d.bnd.FilterLen())
	if d.bndAdoptErr != "" {
		r.Facts["session_boundary_adopt_errors"] = d.bndAdoptErr
	}
	return true
}

// CreateSession makes the session cgroup, registers it with the kernel (one
// mkdir and one map insert, whatever the number of sessions) and, with the
// boundary on, records its boundary: no holder process and no namespace
// until the session's first operation that needs them (a launch, a file
// get or put, a process grant: package boundary's lazy start). If the
// boundary refuses it, the session is destroyed again. Quotas in l are checked before anything is
// made and set before the call returns; a failure destroys the session.
func (d *Dataplane) CreateSession(name string, l Limits) (Session, error) {
	if err := d.CheckLimits(l); err != nil {
		return Session{}, err
	}
	if l.Pids == 0 && d.bnd != nil && d.pidsOnV2() {
		// The sessions' own uids bound their processes (RLIMIT_NPROC);
		// where the pids controller is on cgroup v2 its pids.max does
		// too (a process grant's max_processes lowers it).
		l.Pids = uint64(d.bnd.HostMaxProcs())
	}
	s, err := d.createSession(name)
	if err != nil {
		return s, err
	}
	if !l.IsZero() {
		if err := d.setLimits(name, l); err != nil {
			return Session{}, errors.Join(err, d.DestroySession(name))
		}
	}
	if l.Workspace != nil {
		w := *l.Workspace
		err := d.bnd.SetWorkspace(name, w)
		if err == nil {
			err = d.storeWorkspace(s.Index, &w)
		}
		if err != nil {
			return Session{}, errors.Join(err, d.DestroySession(name))
		}
		d.mu.Lock()
		d.workspaces[name] = &w
		d.mu.Unlock()
	}
	return s, nil
}

// checkWorkspace refuses a workspace this host cannot give a session: its
// form (Workspace.Validate), a directory reached through no symbolic link,
// and the session boundary (the workspace is part of the session's mount
// namespace).
func (d *Dataplane) checkWorkspace(w backend.Workspace) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if d.bnd == nil {
		return fmt.Errorf("%w: a workspace needs the session boundary (its mount namespace)", ErrLimitsUnsupported)
	}
	return d.bnd.CheckWorkspace(w)
}

func (d *Dataplane) createSession(name string) (Session, error) {
	if d.bnd != nil {
		if err := d.bnd.Ready(); err != nil {
			return Session{}, err
		}
	}
	s, err := d.registerSession(name)
	if err != nil || d.bnd == nil {
		return s, err
	}
	if err := d.bnd.Create(s.Name, s.Path, s.Index); err != nil {
		return Session{}, errors.Join(fmt.Errorf("create session %s: %w", name, err), d.DestroySession(name))
	}
	d.mu.Lock()
	cur, ok := d.sessions[name]
	d.mu.Unlock()
	if !ok || cur.CgroupID != s.CgroupID {
		// Destroyed meanwhile: this holder died with its cgroup. (The
		// agent serializes creating and destroying one session, so
		// this is defensive; a same-name session made meanwhile keeps
		// its own holder.)
		if !ok {
			d.bnd.Release(name)
		}
		return Session{}, fmt.Errorf("%w: %s was destroyed while it was being created", ErrSessionNotFound, name)
	}
	return s, nil
}

// releaseBoundary forgets a session whose cgroup was killed.
func (d *Dataplane) releaseBoundary(name string) {
	if d.bnd != nil {
		d.bnd.Release(name)
	}
}

// launch is Launch through the boundary: every launch gets its own cgroup
// below the session's, so killing it (a run's timeout) kills its whole
// tree. Without a boundary every session's processes run as nobody, and
// Launch names no other identity either (boundary.ErrIdentity).
func (d *Dataplane) launch(s Session, cmd *exec.Cmd, opts ProcOptions) error {
	if d.bnd == nil {
		if (opts.UID != 0 && opts.UID != Nobody) || (opts.GID != 0 && opts.GID != Nobody) {
			return fmt.Errorf("%w: launch in %s as uid %d gid %d (sessions without a boundary run as %d)", boundary.ErrIdentity, s.Name, opts.UID, opts.GID, Nobody)
		}
		if !opts.Privileged {
			opts.UID, opts.GID = Nobody, Nobody // never gid 0 by omission
		}
		if cmd.Dir == "" {
			cmd.Dir = "/" // never the agent's own directory by omission
		}
		return StartIn(s, cmd, opts)
	}
	return d.bnd.Launch(s.Name, cmd, opts, true)
}

func (d *Dataplane) closeBoundary() {
	if d.bnd != nil {
		d.bnd.Close()
		d.bnd = nil
	}
}

var _ backend.WorkspaceViews = (*Dataplane)(nil)

// EnsureWorkspace puts w back into session name's view if its mount is not
// there (a holder remade while the agent was down); a holder that outlived
// the agent keeps its view, which is left as it is.
func (d *Dataplane) EnsureWorkspace(name string, w backend.Workspace) error {
	if err := d.checkWorkspace(w); err != nil {
		return err
	}
	ok, err := d.bnd.HasMountAt(name, w.Dir)
	if err != nil || ok {
		return err
	}
	return d.bnd.SetWorkspace(name, w)
}
