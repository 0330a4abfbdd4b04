package dataplane

import (
	"errors"
	"fmt"
	"os/exec"
	"sync/atomic"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The Linux dataplane is the reference backend.
var _ backend.Backend = (*Dataplane)(nil)

// opCounters count the kernel operations behind backend.Ops.
type opCounters struct {
	revokeWrites   atomic.Uint64 // handle-state writes that revoke
	sweeps         atomic.Uint64 // flow sweeps run by Revoke
	followUpSweeps atomic.Uint64 // follow-up sweeps run after revokes (flows_linux.go)
	viewSweeps     atomic.Uint64 // file view changes run by Revoke (files_linux.go)
	execWrites     atomic.Uint64 // writes and deletes of exec LSM entries (exec_lsm_linux.go)
	denyWrites     atomic.Uint64 // deny-table entries written or deleted (deny_linux.go)
}

// Ops reports how many revoke writes, revoke sweeps and follow-up sweeps ran
// since Open.
func (d *Dataplane) Ops() backend.Ops {
	return backend.Ops{RevokeWrites: d.ops.revokeWrites.Load(), Sweeps: d.ops.sweeps.Load(), FollowUpSweeps: d.ops.followUpSweeps.Load(), ViewSweeps: d.ops.viewSweeps.Load()}
}

// Probe returns what Open found on this host.
func (d *Dataplane) Probe() backend.Report { return d.report }

// Launch starts cmd inside the named session: through the session
// boundary's launcher when Config.Boundary is set (see boundary.Launch),
// else as StartIn does.
func (d *Dataplane) Launch(session string, cmd *exec.Cmd, opts backend.LaunchOptions) error {
	s, err := d.Session(session)
	if err != nil {
		return err
	}
	return d.launch(s, cmd, opts)
}

// Apply pushes a grant's Delta: every rule of its sections, in order. It is
// all or nothing: if one fails, the rules it added are taken back (a rule
// that was there before the call stays) and the error says what failed.
func (d *Dataplane) Apply(session string, delta backend.Delta) error {
	if err := delta.Validate(); err != nil {
		return err
	}
	// The process section is checked before anything changes (its
	// programs resolve in the session's view) and applied last.
	if err := d.checkProcess(session, delta.Process); err != nil {
		return err
	}
	var added []EgressRule
	for _, r := range delta.AddressRules() {
		isNew, err := d.allowEgress(session, r)
		if !isNew && err == nil {
			continue
		}
		if err != nil {
			var errs []error
			for i := len(added) - 1; i >= 0; i-- {
				errs = append(errs, d.RemoveEgress(session, added[i]))
			}
			if uerr := errors.Join(errs...); uerr != nil {
				return fmt.Errorf("%w (undo incomplete: %v)", err, uerr)
			}
			return err
		}
		added = append(added, r)
	}
	if err := d.applyFiles(session, delta.Files); err != nil {
		var errs []error
		for i := len(added) - 1; i >= 0; i-- {
			errs = append(errs, d.RemoveEgress(session, added[i]))
		}
		if uerr := errors.Join(errs...); uerr != nil {
			return fmt.Errorf("%w (undo incomplete: %v)", err, uerr)
		}
		return err
	}
	if err := d.applyProcess(session, delta.Process); err != nil {
		errs := []error{d.releaseFiles(session, delta.Files)}
		for i := len(added) - 1; i >= 0; i-- {
			errs = append(errs, d.RemoveEgress(session, added[i]))
		}
		if uerr := errors.Join(errs...); uerr != nil {
			return fmt.Errorf("%w (undo incomplete: %v)", err, uerr)
		}
		return err
	}
	return nil
}

// Release reclaims what a dead grant held: the rules of its Delta in
// session, then its handle slot. It writes no revoke and runs no sweep: the
// handle, or an ancestor of it, must already be revoked (Revoke did that, and
// cut the flows); a live one is refused (ErrHandleLive) before anything is
// removed. Rules and slots already gone are not an error.
func (d *Dataplane) Release(session string, ref HandleRef, delta backend.Delta) error {
	free := false
	if !ref.IsZero() {
		d.mu.Lock()
		h, err := d.readHandle(ref)
		switch {
		case errors.Is(err, ErrHandleNotLive): // freed or recycled already
		case err != nil:
			d.mu.Unlock()
			return err
		case h.State != uint32(HandleRevoked):
			dead, err := d.ancestorRevoked(h)
			if err != nil || !dead {
				d.mu.Unlock()
				if err == nil {
					err = fmt.Errorf("%w: release %s: the handle and its ancestors are live", ErrHandleLive, ref)
				}
				return err
			}
			free = true
		default:
			free = true
		}
		d.mu.Unlock()
	}
	for _, r := range delta.AddressRules() {
		err := d.RemoveEgress(session, r)
		if err != nil && !errors.Is(err, ErrRuleNotFound) && !errors.Is(err, ErrSessionNotFound) {
			return fmt.Errorf("release %s: remove %s: %w", ref, r, err)
		}
	}
	if err := d.releaseFiles(session, delta.Files); err != nil && !errors.Is(err, ErrSessionNotFound) {
		return fmt.Errorf("release %s: files: %w", ref, err)
	}
	if err := d.releaseProcess(session, delta.Process); err != nil && !errors.Is(err, ErrSessionNotFound) {
		return fmt.Errorf("release %s: process: %w", ref, err)
	}
	if !free {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.readHandle(ref); errors.Is(err, ErrHandleNotLive) {
		return nil // freed meanwhile
	}
	return d.freeLocked(ref)
}

// Snapshot reads the sessions, the handle table and every session's rules.
func (d *Dataplane) Snapshot() (backend.Snapshot, error) {
	ss, err := d.Sessions()
	if err != nil {
		return backend.Snapshot{}, err
	}
	hs, err := d.Handles()
	if err != nil {
		return backend.Snapshot{}, err
	}
	snap := backend.Snapshot{Sessions: ss, Handles: hs, Deltas: map[string]backend.Delta{}}
	for _, s := range ss {
		rs, err := d.EgressRules(s.Name)
		if errors.Is(err, ErrSessionNotFound) {
			continue // destroyed meanwhile
		}
		if err != nil {
			return backend.Snapshot{}, err
		}
		fs, ps := d.fileEntries(s.Name), d.processEntries(s.Name)
		if len(rs) > 0 || len(fs) > 0 || len(ps) > 0 {
			delta := backend.DeltaOf(rs)
			delta.Files, delta.Process = fs, ps
			snap.Deltas[s.Name] = delta
		}
	}
	return snap, nil
}

// ancestorRevoked reports whether some ancestor of h is revoked, freed or
// recycled, so h is dead in the kernel's eyes without its own bit flipped.
func (d *Dataplane) ancestorRevoked(h shkShkHandle) (bool, error) {
	for i := 0; h.Parent != 0 && i <= MaxChain; i++ {
		p, err := d.readHandle(HandleRef{Slot: h.Parent, Generation: h.ParentGeneration})
		if errors.Is(err, ErrHandleNotLive) || errors.Is(err, ErrInvalidHandle) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if !HandleState(p.State).Alive() {
			return true, nil
		}
		h = p
	}
	return false, nil
}
