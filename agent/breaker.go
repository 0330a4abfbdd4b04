package agent

// Use-time decisions (Decide) and the denial circuit breaker they feed: a
// headless session is terminated when it trips, an attended one escalates.

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/store"
)

// BreakerConfig sets the denial circuit breaker (seeds/permissions.md §6.5).
type BreakerConfig struct {
	Consecutive int // default 3
	Total       int // default 20
}

// Decide answers a use-time request against the base policies and the
// session's live grants, and feeds the denial circuit breaker. It takes no
// agent-wide lock (a.mu): a decision never waits behind a grant, a revoke or
// the sweep; only a denial that trips the breaker does.
func (a *Agent) Decide(session string, r UseRequest) (Decision, error) {
	if r.Class == ClassNetEgress {
		r.IP = kernelDestination(r.IP)
	}
	d, err := a.engine.Decide(session, r, a.cfg.Now())
	if err != nil {
		return Decision{}, err
	}
	if d.Allowed && r.Class == ClassNetEgress && !a.neverReaches(r, d.Reasons) {
		// The never-list, as the kernel applies it (never.go).
		d = Decision{Reasons: []string{NeverListed}, Errors: d.Errors}
	}
	if d.Allowed && len(d.Once) > 0 && a.onceSpent(d.Once) {
		// Only approve-once grants allowed, and the kernel consumed every
		// one of them (its first connect or send): once means once here too.
		d = Decision{Reasons: append([]string{ConsumedOnce}, d.Reasons...), Errors: d.Errors}
	}
	if d.Allowed {
		a.bmu.Lock()
		if b := a.breaker[session]; b != nil && b.Consecutive != 0 {
			b.Consecutive = 0
			a.bdirty[session] = struct{}{}
		}
		a.bmu.Unlock()
	} else {
		a.emit(Event{Kind: EventUseDenied, Session: session, Class: r.Class, Outcome: "denied", Rule: d.DecidedBy()})
		if a.countDenial(session) {
			a.mu.Lock()
			a.trip(session)
			a.unlock()
		}
	}
	return d, nil
}

// EventUseDenied is the Event kind of a use-time request Decide denied.
const EventUseDenied = "deny"

// NeverListed is the rule of a use-time denial of a never-listed
// destination that no grant's never-list exception reaches.
const NeverListed = "never-list"

// ConsumedOnce is the rule of a use-time denial whose only permits were
// approve-once grants the kernel had consumed.
const ConsumedOnce = "consumed once-grant"

// onceSpent reports whether the kernel consumed every one of these
// approve-once handles (or they died). A handle that cannot be read counts
// as spent (fail closed).
func (a *Agent) onceSpent(refs []backend.HandleRef) bool {
	for _, ref := range refs {
		st, err := a.kernel.HandleState(ref)
		if err == nil && st == backend.HandleOnce {
			return false
		}
	}
	return true
}

// breakerFor returns the session's live breaker counters; a.bmu held. The
// counters are seeded from the persisted state when a session is created or
// loaded (under a.mu), so this never reads a.st.
func (a *Agent) breakerFor(session string) *BreakerState {
	b := a.breaker[session]
	if b == nil {
		b = &BreakerState{}
		a.breaker[session] = b
	}
	return b
}

// countDenial counts a denial on the session's breaker and reports whether
// it tripped it now. A session without breaker counters (unknown, or ended)
// counts nothing. a.bmu only: the persisted record gets the counters at the
// next state write (syncBreakers) and at the trip.
func (a *Agent) countDenial(session string) bool {
	a.bmu.Lock()
	defer a.bmu.Unlock()
	b := a.breaker[session]
	if b == nil {
		return false
	}
	b.Consecutive++
	b.Total++
	a.bdirty[session] = struct{}{}
	trip := !b.Tripped && (b.Consecutive >= a.cfg.Breaker.Consecutive || b.Total >= a.cfg.Breaker.Total)
	if trip {
		b.Tripped = true
	}
	return trip
}

// syncBreakers copies the live breaker counters into the session records,
// so a state write carries them; a.mu held.
func (a *Agent) syncBreakers() (changed []string) {
	a.bmu.Lock()
	defer a.bmu.Unlock()
	// Only the breakers that moved since the last write (a scan of every
	// session's would cost each grant the number of sessions).
	for id := range a.bdirty {
		delete(a.bdirty, id)
		if rec, ok := a.st.Sessions[id]; ok && a.breaker[id] != nil && rec.Breaker != *a.breaker[id] {
			rec.Breaker = *a.breaker[id]
			changed = append(changed, store.SessionKey(id))
		}
	}
	return changed
}

// denied counts a denial; on reaching a threshold the breaker trips: a
// headless session is terminated, an attended one escalates (every later
// grant needs a human). Called with a.mu held.
func (a *Agent) denied(session string, cause error) {
	if rec, ok := a.st.Sessions[session]; !ok || rec.Phase != SessionActive {
		return
	}
	if a.countDenial(session) {
		a.trip(session)
	}
}

// trip acts on a breaker that just tripped: the event, then the headless
// session's end or the attended one's escalation, persisted. a.mu held.
func (a *Agent) trip(session string) {
	rec, ok := a.st.Sessions[session]
	if !ok || rec.Phase != SessionActive {
		return
	}
	a.bmu.Lock()
	b := *a.breakerFor(session)
	a.bmu.Unlock()
	a.emit(Event{Kind: "breaker.trip", Session: session, Outcome: fmt.Sprintf("consecutive=%d total=%d headless=%t", b.Consecutive, b.Total, rec.Spec.Headless)})
	if rec.Spec.Headless {
		if err := a.endSessionLocked(session, "terminated by the denial circuit breaker"); err != nil {
			a.cfg.Logger.Error("breaker: terminate session", "session", session, "err", err)
		}
		return
	}
	if err := a.persist(); err != nil {
		a.cfg.Logger.Error("breaker: persist", "session", session, "err", err)
	}
}

// Breaker returns a session's breaker state.
func (a *Agent) Breaker(session string) (BreakerState, error) {
	a.mu.Lock()
	defer a.unlock()
	if _, ok := a.st.Sessions[session]; !ok {
		return BreakerState{}, fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	a.bmu.Lock()
	defer a.bmu.Unlock()
	return *a.breakerFor(session), nil
}

// ResetBreaker clears a tripped breaker (a human looked at the session).
func (a *Agent) ResetBreaker(session, actor string) error {
	a.mu.Lock()
	defer a.unlock()
	rec, ok := a.st.Sessions[session]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	a.bmu.Lock()
	*a.breakerFor(session) = BreakerState{}
	rec.Breaker = BreakerState{}
	a.bmu.Unlock()
	a.emit(Event{Kind: "breaker.reset", Session: session, Actor: actor})
	return a.persist()
}
