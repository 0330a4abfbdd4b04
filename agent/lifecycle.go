package agent

// Caretaker layer: handle lifecycles. A token resolves to its grant; a grant
// is live until it is revoked, expires or (once) is used; Sweep tears down
// what expired, ends expired sessions, prunes old tombstones and times
// out approvals.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// DefaultOnceTTL bounds a once grant whose use is never reported.
const DefaultOnceTTL = 5 * time.Minute

// resolveHandle verifies a token and returns its grant.
func (a *Agent) resolveHandle(token string) (*GrantRecord, error) {
	id, err := a.minter.verify(token)
	if err != nil {
		return nil, err
	}
	g, ok := a.st.Grants[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s…", ErrUnknownHandle, id[:8])
	}
	return g, nil
}

func (a *Agent) grantLive(g *GrantRecord, now time.Time) error {
	if g.Phase != PhaseLive {
		return fmt.Errorf("%w: grant %s is %s", ErrHandleRevoked, g.ID[:8], g.Phase)
	}
	if !g.Expires.IsZero() && !now.Before(g.Expires) {
		return fmt.Errorf("%w: grant %s expired at %s", ErrHandleRevoked, g.ID[:8], g.Expires.Format(time.RFC3339))
	}
	return nil
}

var lifecycleRank = map[Lifecycle]int{LifecycleOnce: 0, LifecycleSession: 1, LifecycleStanding: 2}

// Consume reports the one use of a once grant, which revokes it; for other
// lifecycles it only checks the handle is live.
func (a *Agent) Consume(ctx context.Context, token string) error {
	a.mu.Lock()
	defer a.unlock()
	g, err := a.resolveHandle(token)
	if err != nil {
		return err
	}
	if err := a.grantLive(g, a.cfg.Now()); err != nil {
		return err
	}
	if g.Lifecycle == LifecycleOnce {
		return a.revokeLocked(g, "used once")
	}
	return nil
}

// Sweep revokes grants whose expiry has passed (the kernel already denies
// them; this tears their state down), retries revocations whose teardown
// failed, ends expired sessions, times out stale approvals and the cards
// that waited on them. The daemon calls it periodically.
func (a *Agent) Sweep(ctx context.Context) error {
	a.mu.Lock()
	defer a.unlock()
	now := a.cfg.Now()
	var errs []error
	// Every second, under the lock: only the records the due index holds
	// are looked at (a pass over every session and grant held the lock for
	// milliseconds at 10,000 sessions), and only those due are sorted
	// (grants oldest first, sessions by id).
	var due []*GrantRecord
	var stale []string
	held := map[string]int{} // tombstones kept, by session
	for id := range a.due.grants {
		g, ok := a.st.Grants[id]
		switch {
		case !ok || !grantMayBeDue(g):
			delete(a.due.grants, id)
		case g.Phase == PhaseLive && !g.Expires.IsZero() && !now.Before(g.Expires), g.Phase == PhaseRevoking:
			due = append(due, g)
		case g.Phase.Terminal() && now.Sub(g.Ended) > a.cfg.TombstoneRetention:
			stale = append(stale, id)
		case g.Phase.Terminal():
			held[g.Session]++
		}
	}
	for session, n := range held {
		if n > a.cfg.TombstonesPerSession {
			stale = append(stale, a.oldestTombstones(session, n-a.cfg.TombstonesPerSession)...)
		}
	}
	slices.SortFunc(due, grantOrder)
	for _, g := range due { // each looked at again: an earlier one's revoke may have ended it
		switch {
		case g.Phase == PhaseLive && !now.Before(g.Expires):
			errs = append(errs, a.revokeLocked(g, "expired"))
		case g.Phase == PhaseRevoking: // a teardown that failed earlier: retry
			errs = append(errs, a.revokeLocked(g, g.EndReason))
		}
	}
	var expired []string
	for id := range a.due.sessions {
		rec, ok := a.st.Sessions[id]
		switch {
		case !ok || !sessionMayBeDue(rec):
			delete(a.due.sessions, id)
		case rec.Phase == SessionActive && !now.Before(rec.Spec.Expires):
			expired = append(expired, id)
		}
	}
	slices.Sort(expired)
	for _, id := range expired {
		errs = append(errs, a.endSessionLocked(id, "session expired"))
	}
	changed := false
	for _, id := range stale { // past the retention or the session's cap
		if g, ok := a.st.Grants[id]; ok && g.Phase.Terminal() {
			delete(a.st.Grants, id)
			a.unindex(g)
			changed = true
		}
	}
	// Decided cards are kept as long as tombstones (the audit log keeps
	// every decision for good); a pending card stays until it is decided
	// or times out.
	for id, c := range a.st.Cards {
		if c.Status != CardPending && now.Sub(c.Expires) > a.cfg.TombstoneRetention {
			delete(a.st.Cards, id)
			changed = true
		}
	}
	for id, ap := range a.st.Approvals {
		if !now.Before(ap.Expires) {
			delete(a.st.Approvals, id)
			changed = true
			a.emit(Event{Kind: "approval.timeout", Session: ap.Request.Session, Class: ap.Request.Capability.Class, Outcome: "timed_out"})
		}
	}
	if changed {
		errs = append(errs, a.persist())
	}
	a.syncCards() // cards whose approvals timed out or whose session ended
	return errors.Join(errs...)
}

// DefaultTombstonesPerSession is Config.TombstonesPerSession's default.
const DefaultTombstonesPerSession = 256

// oldestTombstones names the session's n oldest tombstones (by end, then
// id).
func (a *Agent) oldestTombstones(session string, n int) []string {
	var tombs []*GrantRecord
	for _, g := range a.bySession[session] {
		if g.Phase.Terminal() {
			tombs = append(tombs, g)
		}
	}
	slices.SortFunc(tombs, func(x, y *GrantRecord) int {
		if c := x.Ended.Compare(y.Ended); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
	ids := make([]string, 0, n)
	for _, g := range tombs[:min(n, len(tombs))] {
		ids = append(ids, g.ID)
	}
	return ids
}
