package agent

// Approvals: an Ask-tier request waits for a human as a pending approval;
// approve (with the lifecycle chosen), deny (a denial for the breaker) or
// cancel (a dismissal).

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/shinken-agent/shinken/agent/store"
)

// DefaultApprovalTimeout is how long an Ask waits for a human.
const DefaultApprovalTimeout = 10 * time.Minute

// PendingApprovals lists the Asks waiting for a human.
func (a *Agent) PendingApprovals() []ApprovalRecord {
	a.mu.Lock()
	defer a.unlock()
	var out []ApprovalRecord
	for _, ap := range a.st.Approvals {
		out = append(out, *ap)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Approve runs a pending Ask through the GRANT sequence on behalf of
// approver. The gate runs again (policies or the session may have changed).
func (a *Agent) Approve(ctx context.Context, id, approver string) (*Grant, error) {
	a.mu.Lock()
	defer a.unlock()
	return a.approveLocked(ctx, id, approver)
}

// approveLocked is Approve; a.mu held.
func (a *Agent) approveLocked(ctx context.Context, id, approver string) (*Grant, error) {
	ap, ok := a.st.Approvals[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownApproval, id)
	}
	if approver == "" {
		return nil, fmt.Errorf("%w: approval without an approver", ErrInvalidRequest)
	}
	delete(a.st.Approvals, id)
	if !a.cfg.Now().Before(ap.Expires) {
		err := a.persist()
		a.emit(Event{Kind: "approval.timeout", Session: ap.Request.Session, Outcome: "timed_out"})
		return nil, errors.Join(fmt.Errorf("%w: %s", ErrApprovalExpired, id), err)
	}
	if err := a.persist(); err != nil {
		a.st.Approvals[id] = ap
		return nil, err
	}
	a.emit(Event{Kind: "approval.approve", Session: ap.Request.Session, Class: ap.Request.Capability.Class, Actor: approver, Outcome: id})
	req := ap.Request
	if ap.ParentGrant != "" {
		req.Parent = a.minter.tokenFor(ap.ParentGrant)
	}
	g, err := a.grantLocked(ctx, req, approver, true)
	if err != nil && !errors.Is(err, ErrKernel) && !errors.Is(err, ErrState) {
		a.denied(ap.Request.Session, err)
	}
	return g, err
}

// DenyApproval records a human's explicit deny (a denial for the breaker).
func (a *Agent) DenyApproval(ctx context.Context, id, approver string) error {
	a.mu.Lock()
	defer a.unlock()
	return a.denyApprovalLocked(id, approver)
}

// denyApprovalLocked is DenyApproval; a.mu held.
func (a *Agent) denyApprovalLocked(id, approver string) error {
	ap, err := a.takeApproval(id)
	if err != nil {
		return err
	}
	a.emit(Event{Kind: "approval.deny", Session: ap.Request.Session, Class: ap.Request.Capability.Class, Actor: approver, Outcome: id})
	a.denied(ap.Request.Session, ErrDenied)
	return nil
}

// ApproveAs approves pending approval id like Approve, with the lifecycle the
// human chose on the card (once or session) instead of the requested one.
// Standing grants stay admin-policy only.
func (a *Agent) ApproveAs(ctx context.Context, id, approver string, lc Lifecycle) (*Grant, error) {
	a.mu.Lock()
	defer a.unlock()
	return a.approveAsLocked(ctx, id, approver, lc)
}

// approveAsLocked is ApproveAs; a.mu held.
func (a *Agent) approveAsLocked(ctx context.Context, id, approver string, lc Lifecycle) (*Grant, error) {
	if lc != LifecycleOnce && lc != LifecycleSession {
		return nil, fmt.Errorf("%w: approve as %q: want once or session", ErrInvalidRequest, lc)
	}
	if approver == "" { // checked before the card is changed: bad input changes nothing
		return nil, fmt.Errorf("%w: approval without an approver", ErrInvalidRequest)
	}
	ap, ok := a.st.Approvals[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownApproval, id)
	}
	ap.Request.Lifecycle = lc
	if lc == LifecycleSession {
		ap.Request.TTL = 0
	}
	return a.approveLocked(ctx, id, approver)
}

// CancelApproval dismisses a pending approval without deciding it: the
// request does not run, and unlike DenyApproval it is not recorded as a
// denial (the circuit breaker does not count it).
func (a *Agent) CancelApproval(id, actor string) error {
	a.mu.Lock()
	defer a.unlock()
	return a.cancelApprovalLocked(id, actor)
}

// cancelApprovalLocked is CancelApproval; a.mu held.
func (a *Agent) cancelApprovalLocked(id, actor string) error {
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
	if err := a.store.Write([]string{store.ApprovalKey(id)}, true); err != nil {
		a.st.Approvals[id] = ap
		return nil, err
	}
	return ap, nil
}
