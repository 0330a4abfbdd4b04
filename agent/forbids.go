package agent

// The policies in force, in the kernel: the admin and hard-deny forbids
// whose condition is a destination are the backend's deny table
// (backend.DenyEntry, compiled by policy.KernelForbids), and every live
// grant's never-list exceptions and file overrides (fsoverride.go) are
// re-derived from the admin permits in force. Both follow each policy apply and reload, and Open.

import (
	"errors"
	"fmt"

	"github.com/shinken-agent/shinken/agent/policy"
	"github.com/shinken-agent/shinken/agent/store"
)

// Forbids says which forbids the kernel enforces (its deny table) and
// which only Decide and the resolver do, for the policies in force.
func (a *Agent) Forbids() *ForbidReport {
	a.mu.Lock()
	defer a.unlock()
	return a.forbids.Report()
}

// setDenyList puts kf's deny table in the backend; a.mu held. On failure
// the previous table is put back.
func (a *Agent) setDenyList(kf policy.KernelForbids) error {
	if err := a.kernel.SetDenyList(kf.Entries); err != nil {
		err = fmt.Errorf("%w: deny table: %w", ErrKernel, err)
		if rerr := a.kernel.SetDenyList(a.forbids.Entries); rerr != nil {
			err = fmt.Errorf("%w (restoring the previous table: %v)", err, rerr)
		}
		return err
	}
	a.forbids = kf
	return nil
}

// rederiveNever makes every live grant's never-list exceptions what the
// admin permits in force say: an exception whose permit went is taken back
// (SetNeverOK), one a permit now names is given; the grant's record follows.
// a.mu held.
func (a *Agent) rederiveNever() error {
	var errs []error
	for _, rec := range a.sortedGrants() {
		if rec.Phase != PhaseLive {
			continue
		}
		changed := false
		for i, r := range rec.Delta.Egress {
			want := a.neverOK(rec.Session, r)
			if want == r.NeverOK {
				continue
			}
			r.NeverOK = want
			if err := a.kernel.SetNeverOK(rec.Session, r); err != nil {
				errs = append(errs, fmt.Errorf("%w: grant %s: never-list exception %s: %w", ErrKernel, rec.ID, r, err))
				continue
			}
			rec.Delta.Egress[i] = r
			changed = true
		}
		a.noteNeverRules(rec)
		fchanged, ferr := a.rederiveFileOverrides(rec)
		errs = append(errs, ferr)
		changed = changed || fchanged
		if changed {
			errs = append(errs, a.persistKeys(store.GrantKey(rec.ID)))
		}
	}
	return errors.Join(errs...)
}

// syncPolicyKernel puts the policies in force into the kernel: the deny
// table, then the never-list exceptions; a.mu held.
func (a *Agent) syncPolicyKernel() error {
	if err := a.setDenyList(a.engine.KernelForbids()); err != nil {
		return err
	}
	return a.rederiveNever()
}

// install puts the set nb in force: its deny table in the kernel first
// (a forbid it adds is never missing there while Decide applies it), then
// the engine, then the never-list exceptions re-derived. between runs
// after the kernel write and before the engine swap (ApplyPolicies writes
// the files there); its failure puts the previous table back and leaves
// the engine as it was. a.mu is taken.
func (a *Agent) install(nb *policy.Set, between func() error) error {
	a.mu.Lock()
	defer a.unlock()
	old := a.forbids
	if err := a.setDenyList(nb.KernelForbids()); err != nil {
		return err
	}
	if between != nil {
		if err := between(); err != nil {
			if rerr := a.setDenyList(old); rerr != nil {
				err = fmt.Errorf("%w (restoring the deny table: %v)", err, rerr)
			}
			return err
		}
	}
	a.engine.Install(nb)
	if err := a.rederiveNever(); err != nil {
		return fmt.Errorf("the set is in force, but: %w", err)
	}
	return nil
}

// reload is Engine.Reload through install.
func (a *Agent) reload(opts ReloadOptions) (*ShiftReport, error) {
	nb, err := a.engine.LoadSet(a.cfg.PolicyDir, nil)
	if err != nil {
		return nil, err
	}
	rep := a.engine.CheckShift(a.engine.Policies(), nb.Policies())
	if rep.Widens() && !opts.AllowWiden {
		return rep, policy.WidensError(rep)
	}
	return rep, a.install(nb, nil)
}
