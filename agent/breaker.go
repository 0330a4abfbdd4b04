package agent

// Use-time decisions (Decide) and the denial circuit breaker they feed: a
// headless session is terminated when it trips, an attended one escalates.

import (
	"fmt"
)

// BreakerConfig sets the denial circuit breaker (seeds/permissions.md §6.5).
type BreakerConfig struct {
	Consecutive int // default 3
	Total       int // default 20
}

// Decide answers a use-time request against the base policies and the
// session's live grants, and feeds the denial circuit breaker.
func (a *Agent) Decide(session string, r UseRequest) (Decision, error) {
	d, err := a.engine.Decide(session, r, a.cfg.Now())
	if err != nil {
		return Decision{}, err
	}
	if d.Allowed {
		a.bmu.Lock()
		a.breakerFor(session).Consecutive = 0
		a.bmu.Unlock()
	} else {
		a.emit(Event{Kind: "deny", Session: session, Class: r.Class, Outcome: "denied", Rule: fmt.Sprint(d.Reasons)})
		a.mu.Lock()
		a.denied(session, ErrDenied)
		a.unlock()
	}
	return d, nil
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

// denied counts a denial; on reaching a threshold the breaker trips: a
// headless session is terminated, an attended one escalates (every later
// grant needs a human). Called with a.mu held.
func (a *Agent) denied(session string, cause error) {
	rec, ok := a.st.Sessions[session]
	if !ok || rec.Phase != SessionActive {
		return
	}
	a.bmu.Lock()
	b := a.breakerFor(session)
	b.Consecutive++
	b.Total++
	trip := !b.Tripped && (b.Consecutive >= a.cfg.Breaker.Consecutive || b.Total >= a.cfg.Breaker.Total)
	if trip {
		b.Tripped = true
	}
	rec.Breaker = *b
	a.bmu.Unlock()
	if !trip {
		return
	}
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
