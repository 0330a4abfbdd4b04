package agent

import (
	"context"
	"fmt"
)

// ApproveAs approves pending approval id like Approve, with the lifecycle the
// human chose on the card (once or session) instead of the requested one.
// Standing grants stay admin-policy only.
func (a *Agent) ApproveAs(ctx context.Context, id, approver string, lc Lifecycle) (*Grant, error) {
	if lc != LifecycleOnce && lc != LifecycleSession {
		return nil, fmt.Errorf("%w: approve as %q: want once or session", ErrInvalidRequest, lc)
	}
	if approver == "" { // checked before the card is changed: bad input changes nothing
		return nil, fmt.Errorf("%w: approval without an approver", ErrInvalidRequest)
	}
	a.mu.Lock()
	ap, ok := a.st.Approvals[id]
	if ok {
		ap.Request.Lifecycle = lc
		if lc == LifecycleSession {
			ap.Request.TTL = 0
		}
	}
	a.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownApproval, id)
	}
	return a.Approve(ctx, id, approver)
}

// CancelApproval dismisses a pending approval without deciding it: the
// request does not run, and unlike DenyApproval it is not recorded as a
// denial (the circuit breaker does not count it).
func (a *Agent) CancelApproval(id, actor string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	ap, err := a.takeApproval(id)
	if err != nil {
		return err
	}
	return a.emit(Event{Kind: "approval.cancel", Session: ap.Request.Session, Class: ap.Request.Capability.Class, Actor: actor, Outcome: "cancelled"})
}

// takeApproval removes pending approval id and persists that (only that
// record changes); on a persistence error the approval stays. a.mu held.
func (a *Agent) takeApproval(id string) (*ApprovalRecord, error) {
	ap, ok := a.st.Approvals[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownApproval, id)
	}
	delete(a.st.Approvals, id)
	if err := a.store.saveKeys(a.st, "a/"+id); err != nil {
		a.st.Approvals[id] = ap
		return nil, err
	}
	return ap, nil
}

// Close releases the state journal. The agent must not be used afterwards.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.store.close()
}
