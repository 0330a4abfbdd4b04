package agent

// The REVOKE protocol and the membrane: one backend write on the root's
// handle kills the whole subtree (the kernel walks the parent chain), then the
// subtree is recorded revoking, its Cedar policies removed, its rules and
// slots reclaimed deepest-first with no further write or sweep, and recorded
// revoked.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/store"
)

// Revoke runs the REVOKE sequence on the grant behind a handle token and on
// every grant attenuated from it (the membrane). The kernel handle's state
// word is flipped first: from that write on, the kernel denies the grant and
// all its descendants. Revoking a revoked handle succeeds (idempotent); a
// forged token is refused.
func (a *Agent) Revoke(ctx context.Context, token string) (err error) {
	defer a.timeRevoke(time.Now(), &err)
	a.mu.Lock()
	defer a.unlock()
	g, err := a.resolveHandle(token)
	if errors.Is(err, ErrUnknownHandle) {
		// The MAC is ours, so the agent issued it; a grant that is not in
		// the state was pruned long after its revocation (or never went
		// live): nothing is live under it (reconcile guarantees the kernel
		// holds no handle the state does not account for).
		return nil
	}
	if err != nil {
		return err
	}
	return a.revokeLocked(g, "revoked")
}

// RevokeGrant revokes by grant id (operator path).
func (a *Agent) RevokeGrant(ctx context.Context, id string) (err error) {
	defer a.timeRevoke(time.Now(), &err)
	a.mu.Lock()
	defer a.unlock()
	g, ok := a.st.Grants[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownHandle, id)
	}
	return a.revokeLocked(g, "revoked")
}

// timeRevoke records how long a successful revoke call took.
func (a *Agent) timeRevoke(t0 time.Time, err *error) {
	if *err == nil {
		a.emit(Event{Kind: EventRevokeDone, Took: time.Since(t0)})
	}
}

// descendants returns every grant attenuated (transitively) from g, deepest
// last.
func (a *Agent) descendants(g *GrantRecord) []*GrantRecord {
	var out []*GrantRecord
	frontier := []*GrantRecord{g}
	for len(frontier) > 0 {
		var next []*GrantRecord
		for _, p := range frontier {
			for _, c := range a.children[p.ID] {
				next = append(next, c)
			}
		}
		slices.SortFunc(next, grantOrder) // each level oldest first
		out = append(out, next...)
		frontier = next
	}
	return out
}

func (a *Agent) revokeLocked(g *GrantRecord, reason string) error {
	subtree := append([]*GrantRecord{g}, a.descendants(g)...)
	keys := make([]string, len(subtree))
	for i, x := range subtree {
		keys[i] = store.GrantKey(x.ID)
	}
	if g.Phase.Terminal() {
		// Done before; a revocation whose last write failed (a full disk)
		// is recorded now. Records already on disk cost nothing.
		return a.persistKeys(keys...)
	}
	var errs []error
	// 1. Flip the caretaker bit: one kernel write kills g and, through the
	// parent chain the kernel walks, every descendant; the backend cuts the
	// open flows no live grant covers any more (one sweep) before it returns.
	if !g.Kernel.IsZero() {
		if err := a.kernel.Revoke(g.Kernel); err != nil && !handleGone(err) {
			errs = append(errs, fmt.Errorf("%w: revoke %s: %w", ErrKernel, g.Kernel, err))
		}
	}
	a.crash(StepRevokeFlipped)
	for _, x := range subtree {
		if !x.Phase.Terminal() {
			x.Phase = PhaseRevoking
			x.EndReason = reason
			a.due.noteGrant(x)
		}
	}
	if err := a.persistIntent(keys...); err != nil {
		errs = append(errs, err)
	}
	a.crash(StepRevokeIntent)
	// 2. Remove the grants' Cedar policies.
	for _, x := range subtree {
		a.engine.RemoveGrant(x.Session, x.ID)
	}
	a.crash(StepRevokePolicy)
	// 3. Reclaim the OS delta, deepest first: no further revoke write and no
	// further sweep (the descendants died with g's bit; a freed slot, or one
	// recycled under a new generation, fails the kernel's chain walk too).
	for i := len(subtree) - 1; i >= 0; i-- {
		x := subtree[i]
		if x.Phase != PhaseRevoking {
			continue
		}
		if err := a.teardown(x); err != nil {
			errs = append(errs, err)
			continue
		}
		x.Phase = PhaseRevoked
		x.Ended = a.cfg.Now()
	}
	a.crash(StepRevokeFreed)
	if err := a.persistKeys(keys...); err != nil {
		errs = append(errs, err)
	}
	a.crash(StepRevokeDone)
	// 4. Emit the event.
	for _, x := range subtree {
		if err := a.emit(Event{Kind: "grant.revoke", Session: x.Session, Grant: x.ID, Class: x.Capability.Class, Outcome: string(x.Phase), Rule: reason}); err != nil {
			errs = append(errs, err)
		}
	}
	a.crash(StepRevokeEmitted)
	return errors.Join(errs...)
}

// teardown reclaims a dead grant's kernel state in one Release: its Delta,
// then its slot (a crash inside leaves the rest for reconcile). The grant's
// handle, or an ancestor's, must already be revoked. Every step tolerates
// "already gone".
func (a *Agent) teardown(x *GrantRecord) error {
	err := a.kernel.Release(x.Session, x.Kernel, x.Delta)
	if errors.Is(err, backend.ErrHandleLive) {
		// The revoke write failed: take the entries out now, so nothing
		// stays reachable; the slot waits for a retry (or reconcile).
		if rerr := a.kernel.Release(x.Session, backend.HandleRef{}, x.Delta); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return fmt.Errorf("%w: release %s: %w", ErrKernel, x.Kernel, err)
	}
	if err != nil && !handleGone(err) {
		return fmt.Errorf("%w: release %s: %w", ErrKernel, x.Kernel, err)
	}
	a.crash(StepRevokeReleased)
	return nil
}
