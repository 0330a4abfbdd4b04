package agent

// The GRANT protocol (seeds/permissions.md §2): the pre-grant gate (manifest,
// attenuation bound, tier, enforceability, approval), then Cedar's grant
// decision, the permissiveness check of the compiled policy, and the
// crash-safe sequence intent → handle → rules → live → event, rolled back
// at any failure. The steps are named for crash injection.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/agent/store"
)

// Errors of the grant protocol.
var (
	ErrSessionExists     = errors.New("agent: session already exists")
	ErrSessionInactive   = errors.New("agent: session is not active")
	ErrBlockTier         = errors.New("agent: Block tier is never grantable in-session")
	ErrStandingInSession = errors.New("agent: standing grants are set in admin policy only")
	ErrApprovalRequired  = errors.New("agent: human approval required")
	ErrUnknownApproval   = errors.New("agent: unknown approval")
	ErrApprovalExpired   = errors.New("agent: approval timed out")
	ErrBreakerTripped    = errors.New("agent: denial circuit breaker tripped")
	ErrKernel            = errors.New("agent: kernel step failed")
)

// ApprovalRequiredError carries the pending approval an Ask-tier request
// created; it wraps ErrApprovalRequired.
type ApprovalRequiredError struct {
	ID   string
	Tier Tier
}

func (e *ApprovalRequiredError) Error() string {
	return fmt.Sprintf("%v: pending approval %s (tier %s)", ErrApprovalRequired, e.ID, e.Tier)
}
func (e *ApprovalRequiredError) Unwrap() error { return ErrApprovalRequired }

// Step names one step of GRANT or REVOKE, for crash injection.
type Step string

// The steps a crash can be injected after.
const (
	StepGrantAuthorized   Step = "grant.authorized"    // Cedar said yes
	StepGrantProved       Step = "grant.proved"        // permissiveness check passed
	StepGrantIntent       Step = "grant.intent"        // pending record persisted
	StepGrantHandleIssued Step = "grant.handle-issued" // kernel handle exists, not yet recorded
	StepGrantHandleSaved  Step = "grant.handle-saved"  // kernel ref recorded
	StepGrantApplying     Step = "grant.applying"      // the Delta recorded, not yet pushed
	StepGrantDeltaApplied Step = "grant.delta-applied" // the Delta in, not yet live
	StepGrantRecorded     Step = "grant.recorded"      // its audit records written and being made durable (or durable), the live record not yet written
	StepGrantLive         Step = "grant.live"          // live record persisted, its audit records durable
	StepGrantEmitted      Step = "grant.emitted"       // event emitted and committed (the same point as grant.live)
	StepRevokeFlipped     Step = "revoke.flipped"      // kernel bit flipped, nothing recorded
	StepRevokeIntent      Step = "revoke.intent"       // revoking recorded
	StepRevokePolicy      Step = "revoke.policy"       // Cedar policy removed
	StepRevokeReleased    Step = "revoke.released"     // after each grant's Delta and slot are released
	StepRevokeFreed       Step = "revoke.freed"        // the whole subtree released
	StepRevokeDone        Step = "revoke.done"         // revoked record persisted
	StepRevokeEmitted     Step = "revoke.emitted"      // event emitted
	StepSessionIntent     Step = "session.intent"      // creating record made (in memory only)
	StepSessionKernel     Step = "session.kernel"      // kernel cgroup exists, not yet active
	StepSessionRecorded   Step = "session.recorded"    // its audit record durable (or being checkpointed), the active record not yet written
)

// GrantSteps and RevokeSteps list the steps in order.
var (
	GrantSteps   = []Step{StepGrantAuthorized, StepGrantProved, StepGrantIntent, StepGrantHandleIssued, StepGrantHandleSaved, StepGrantApplying, StepGrantDeltaApplied, StepGrantRecorded, StepGrantLive, StepGrantEmitted}
	RevokeSteps  = []Step{StepRevokeFlipped, StepRevokeIntent, StepRevokePolicy, StepRevokeReleased, StepRevokeFreed, StepRevokeDone, StepRevokeEmitted}
	SessionSteps = []Step{StepSessionIntent, StepSessionKernel, StepSessionRecorded}
)

// Grant runs the pre-grant gate and, for Auto and Notify tiers, the GRANT
// sequence. An Ask-tier request creates a pending approval and returns an
// *ApprovalRequiredError; Block is refused. Every refusal counts towards the
// session's denial circuit breaker. A failure at any step rolls the whole
// grant back.
func (a *Agent) Grant(ctx context.Context, req GrantRequest) (*Grant, error) {
	if req.Capability.Validate() == nil {
		// The proof, before the lock (prove.go); its error, if any, comes
		// in its place in the sequence.
		a.prove(req.Session, req.Capability, a.cfg.Now())
	}
	a.mu.Lock()
	defer a.unlock()
	return a.grantCounted(ctx, req)
}

// grantCounted is Grant; a.mu held.
func (a *Agent) grantCounted(ctx context.Context, req GrantRequest) (*Grant, error) {
	g, err := a.grantLocked(ctx, req, "", false)
	if err != nil && !errors.Is(err, ErrApprovalRequired) && !errors.Is(err, ErrKernel) && !errors.Is(err, ErrState) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		a.denied(req.Session, err)
	}
	return g, err
}

// Attenuate derives a narrower grant from the live grant behind parent
// (for the same session or a sub-agent's session). Widening is refused.
func (a *Agent) Attenuate(ctx context.Context, parent string, req GrantRequest) (*Grant, error) {
	req.Parent = parent
	g, err := a.Grant(ctx, req)
	outcome, id := "granted", ""
	if err != nil {
		outcome = "refused: " + err.Error()
	} else {
		id = g.ID
	}
	params, _ := json.Marshal(req.Capability)
	if eerr := a.emit(Event{Kind: EventAttenuate, Actor: actorOf(ctx), Requester: req.Requester, Session: req.Session, Class: req.Capability.Class,
		Params: params, Outcome: outcome, Grant: id}); eerr != nil && err == nil {
		a.cfg.Logger.Error("record attenuation", "err", eerr)
	}
	return g, err
}

// check runs the pre-grant gate and returns the record to issue.
func (a *Agent) check(req GrantRequest, approved bool) (*GrantRecord, error) {
	now := a.cfg.Now()
	if err := req.Capability.Validate(); err != nil {
		return nil, err
	}
	c := req.Capability.Normalized()
	prov, err := ParseProvenance(string(req.Provenance))
	if err != nil {
		return nil, err
	}
	switch req.Lifecycle {
	case LifecycleOnce, LifecycleSession:
	case LifecycleStanding:
		return nil, ErrStandingInSession
	default:
		return nil, fmt.Errorf("%w: lifecycle %q (want once or session)", ErrInvalidRequest, req.Lifecycle)
	}
	if req.TTL < 0 {
		return nil, fmt.Errorf("%w: negative TTL", ErrInvalidRequest)
	}
	if c.IsEmpty() {
		return nil, fmt.Errorf("%w: empty capability grants nothing", ErrInvalidRequest)
	}
	sess, ok := a.st.Sessions[req.Session]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownSession, req.Session)
	}
	if sess.Phase != SessionActive {
		return nil, fmt.Errorf("%w: %q is %s", ErrSessionInactive, req.Session, sess.Phase)
	}
	// Inside the manifest.
	entry, err := a.manifests[sess.Spec.Image].Match(c)
	if err != nil {
		return nil, err
	}
	rec := &GrantRecord{Session: req.Session, Capability: c, Provenance: prov, Lifecycle: req.Lifecycle, Created: now}
	// Expiry: TTL, then session end, then the parent's.
	ttl := req.TTL
	if ttl == 0 && req.Lifecycle == LifecycleOnce {
		ttl = DefaultOnceTTL
	}
	if ttl > 0 {
		rec.Expires = now.Add(ttl)
	}
	if e := sess.Spec.Expires; !e.IsZero() && (rec.Expires.IsZero() || e.Before(rec.Expires)) {
		rec.Expires = e
	}
	var parent *GrantRecord
	if req.Parent != "" {
		if parent, err = a.resolveHandle(req.Parent); err != nil {
			return nil, err
		}
		if err := a.grantLive(parent, now); err != nil {
			return nil, err
		}
		if err := c.Within(parent.Capability); err != nil {
			return nil, fmt.Errorf("attenuation of %s: %w", parent.ID[:8], err)
		}
		if lifecycleRank[req.Lifecycle] > lifecycleRank[parent.Lifecycle] {
			return nil, fmt.Errorf("%w: lifecycle %s outlives the parent's %s", ErrWidens, req.Lifecycle, parent.Lifecycle)
		}
		if !parent.Expires.IsZero() && (rec.Expires.IsZero() || parent.Expires.Before(rec.Expires)) {
			rec.Expires = parent.Expires
		}
		rec.Parent = parent.ID
	}
	if !rec.Expires.IsZero() && !now.Before(rec.Expires) {
		return nil, fmt.Errorf("%w: the grant would already be expired", ErrInvalidRequest)
	}
	// Tier.
	var mt *Tier
	if entry != nil {
		mt = entry.Tier
	}
	rec.Tier = EffectiveTier(c, TierContext{Workspace: sess.Spec.Workspace}, mt, prov, sess.Ingredients)
	if parent != nil && rec.Tier < TierBlock && req.Session == parent.Session {
		// Narrowing one's own live grant conveys no new authority: it needs
		// no new approval.
		rec.Tier = min(rec.Tier, parent.Tier)
	}
	if req.Escalation && rec.Tier < TierAsk {
		rec.Tier = TierAsk
	}
	if rec.Tier == TierBlock {
		return nil, fmt.Errorf("%w: %s", ErrBlockTier, c)
	}
	if err := a.enforceable(c); err != nil {
		return nil, err
	}
	a.bmu.Lock()
	tripped := a.breakerFor(req.Session).Tripped
	a.bmu.Unlock()
	if tripped && rec.Tier < TierAsk {
		rec.Tier = TierAsk // an escalated session asks a human for everything
	}
	if rec.Tier == TierAsk && !approved && !(parent != nil && req.Session == parent.Session) {
		return rec, ErrApprovalRequired
	}
	return rec, nil
}

func (a *Agent) grantLocked(ctx context.Context, req GrantRequest, approver string, approved bool) (*Grant, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rec, err := a.check(req, approved)
	if errors.Is(err, ErrApprovalRequired) {
		id, _, merr := a.minter.mint()
		if merr != nil {
			return nil, merr
		}
		id = "apr_" + id[:16]
		now := a.cfg.Now()
		// The parent token is a capability: never store or show it; keep the
		// parent's grant id and re-derive the token at approval.
		stored := req
		stored.Parent = ""
		a.st.Approvals[id] = &ApprovalRecord{ID: id, Request: stored, ParentGrant: rec.Parent, Tier: rec.Tier, Created: now, Expires: now.Add(a.cfg.ApprovalTimeout)}
		if perr := a.persistKeys(store.ApprovalKey(id)); perr != nil {
			delete(a.st.Approvals, id)
			return nil, perr
		}
		a.emit(Event{Kind: "approval.request", Session: req.Session, Class: rec.Capability.Class, Tier: rec.Tier.String(), Provenance: string(rec.Provenance), ParamsSHA256: paramsHash(rec.Capability), Actor: req.Requester, Outcome: id})
		return nil, &ApprovalRequiredError{ID: id, Tier: rec.Tier}
	}
	if err != nil {
		return nil, err
	}
	rec.Approver = approver
	return a.issue(rec)
}

// issue runs the GRANT sequence of seeds/permissions.md §2 on a record that
// passed the gate.
func (a *Agent) issue(rec *GrantRecord) (*Grant, error) {
	now := a.cfg.Now()
	c := rec.Capability
	// 1. Cedar IsAuthorized (cap + scope).
	d, err := a.engine.AuthorizeGrant(rec.Session, c, rec.Tier, rec.Provenance, rec.Lifecycle, now)
	if err != nil {
		return nil, err
	}
	if !d.Allowed {
		return nil, fmt.Errorf("%w: grant of %s (policies: %v)", ErrDenied, c, d.Reasons)
	}
	a.crash(StepGrantAuthorized)
	// 2. Permissiveness check of the grant's compiled policy.
	id, token, err := a.minter.mint()
	if err != nil {
		return nil, err
	}
	rec.ID = id
	gd := GrantData{ID: id, Session: rec.Session, Capability: c, Expires: rec.Expires}
	if err := a.prove(rec.Session, c, now); err != nil {
		return nil, err
	}
	a.crash(StepGrantProved)
	// 3. Issue the handle: intent first, then the kernel, then the record.
	rec.Phase = PhasePending
	a.st.Grants[id] = rec
	a.index(rec)
	key := store.GrantKey(id)
	if err := a.persistIntent(key); err != nil {
		delete(a.st.Grants, id)
		a.unindex(rec)
		return nil, err
	}
	a.crash(StepGrantIntent)
	var parentRef backend.HandleRef
	if rec.Parent != "" {
		parentRef = a.st.Grants[rec.Parent].Kernel
	}
	// Once means once: an approve-once grant gets a handle the kernel
	// consumes at its first allowed use (connect, send), atomically.
	newHandle := a.kernel.NewHandle
	if rec.Lifecycle == LifecycleOnce {
		newHandle = a.kernel.NewOnceHandle
	}
	ref, err := newHandle(parentRef, rec.Expires)
	if err != nil {
		return nil, a.rollback(rec, fmt.Errorf("%w: new handle: %w", ErrKernel, err))
	}
	rec.Kernel = ref
	if rec.Lifecycle == LifecycleOnce {
		gd.Once = ref
	}
	a.crash(StepGrantHandleIssued)
	rec.Phase = PhaseHandle
	if err := a.persistIntent(key); err != nil {
		return nil, a.rollback(rec, err)
	}
	a.crash(StepGrantHandleSaved)
	// 4. Push the OS delta: record what may land in the kernel, then push
	// it in one Apply (all or nothing; a crash inside it leaves part of the
	// recorded Delta in the kernel, which reconcile releases).
	delta := capability.Compile(c, ref)
	a.neverExceptions(rec.Session, delta.Egress)
	a.fileOverrides(rec.Session, delta.Files)
	rec.Delta = delta
	a.noteNeverRules(rec)
	rec.Phase = PhaseApplying
	if err := a.persistIntent(key); err != nil {
		return nil, a.rollback(rec, err)
	}
	a.crash(StepGrantApplying)
	if err := a.kernel.Apply(rec.Session, delta); err != nil {
		return nil, a.rollback(rec, fmt.Errorf("%w: apply %s: %w", ErrKernel, c.Class, err))
	}
	a.crash(StepGrantDeltaApplied)
	if err := a.engine.PutGrant(gd); err != nil {
		return nil, a.rollback(rec, err)
	}
	rec.Phase = PhaseLive
	sess := a.st.Sessions[rec.Session]
	oldIng := sess.Ingredients
	sess.Ingredients = sess.Ingredients.With(c, rec.Provenance)
	// 5. Record the grant, then make it live: the events are written
	// (Defer), then one commit makes them durable with the request records
	// before them (one fdatasync, one checkpoint), and the live record is
	// written and fsynced beside that fdatasync, naming the commit's last
	// record by seq and hash (BesideCommitter: the journal's fsync
	// overlaps the log's fdatasync instead of following it), or once
	// the records are durable (Committer). The answer waits for both. A
	// crash never leaves a live grant the audit log does not show: a live
	// record whose named record the log does not hold is not live at the
	// next start
	// (checkAuditMarks), one before it leaves the grant applying; reconcile
	// rolls both back. Failing to record fails the grant.
	err = a.emit(Event{Kind: "grant.issue", Session: rec.Session, Grant: id, Class: c.Class, Tier: rec.Tier.String(), Provenance: string(rec.Provenance),
		ParamsSHA256: paramsHash(c), Actor: rec.Approver, Outcome: "live", Defer: true})
	if err == nil && rec.Tier == TierNotify {
		err = a.emit(Event{Kind: "grant.notify", Session: rec.Session, Grant: id, Class: c.Class, Tier: rec.Tier.String(), Defer: true})
	}
	if err != nil {
		sess.Ingredients = oldIng
		return nil, a.rollback(rec, fmt.Errorf("emit: %w", err))
	}
	if err := a.commitLive(func(seq uint64, hash string) error {
		a.crash(StepGrantRecorded)
		rec.AuditMark, rec.AuditHash = seq, hash
		return a.persistKeys(key, store.SessionKey(rec.Session))
	}); err != nil {
		sess.Ingredients = oldIng
		return nil, a.rollback(rec, err)
	}
	a.crash(StepGrantLive)
	a.crash(StepGrantEmitted)
	return &Grant{Handle: token, ID: id, Session: rec.Session, Tier: rec.Tier, Lifecycle: rec.Lifecycle, Expires: rec.Expires, Parent: rec.Parent}, nil
}

// rollback undoes a grant that did not go live: handle bit first, then
// rules, policy and handle slot; the record becomes a rolledback tombstone.
func (a *Agent) rollback(rec *GrantRecord, cause error) error {
	var errs []error
	if !rec.Kernel.IsZero() {
		if err := a.kernel.Revoke(rec.Kernel); err != nil && !handleGone(err) {
			errs = append(errs, err)
		}
	}
	// The entries go whatever happened; the slot only once its handle is
	// revoked (a failed revoke write leaves it to reconcile).
	ref := rec.Kernel
	if len(errs) > 0 {
		ref = backend.HandleRef{}
	}
	if err := a.kernel.Release(rec.Session, ref, rec.Delta); err != nil && !handleGone(err) {
		errs = append(errs, err)
	}
	a.engine.RemoveGrant(rec.Session, rec.ID)
	if len(errs) == 0 {
		rec.Phase = PhaseRolledBack
	} else {
		rec.Phase = PhaseRevoking // reconcile finishes the teardown
	}
	rec.Ended = a.cfg.Now()
	rec.EndReason = "rollback: " + cause.Error()
	a.due.noteGrant(rec)
	errs = append(errs, a.persistKeys(store.GrantKey(rec.ID), store.SessionKey(rec.Session)))
	a.emit(Event{Kind: "grant.rollback", Session: rec.Session, Grant: rec.ID, Class: rec.Capability.Class, Outcome: cause.Error()})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w (rollback incomplete: %v)", cause, err)
	}
	return cause
}

func handleGone(err error) bool {
	return errors.Is(err, backend.ErrInvalidHandle) || errors.Is(err, backend.ErrHandleNotLive)
}
