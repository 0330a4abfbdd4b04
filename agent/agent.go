package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dnsresolver"
)

// Errors of the grant protocol.
var (
	ErrInvalidRequest    = errors.New("agent: invalid request")
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

// SessionSpec describes a session at creation.
type SessionSpec struct {
	ID            string    `json:"id"` // also the kernel session (cgroup) name
	Image         string    `json:"image"`
	TrustTier     string    `json:"trust_tier"` // low | normal | high; default normal
	Risk          string    `json:"risk"`       // normal | high; default normal
	Headless      bool      `json:"headless"`
	TLSInspection bool      `json:"tls_inspection"`
	Home          string    `json:"home,omitempty"`      // for the protected-path forbids
	Workspace     string    `json:"workspace,omitempty"` // for the tier table
	Expires       time.Time `json:"expires,omitzero"`    // session end; zero: none
}

func (s *SessionSpec) normalize() error {
	if err := backend.ValidSessionName(s.ID); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err := validateToken("image", s.Image); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if s.TrustTier == "" {
		s.TrustTier = "normal"
	}
	if s.Risk == "" {
		s.Risk = "normal"
	}
	if !slices.Contains([]string{"low", "normal", "high"}, s.TrustTier) {
		return fmt.Errorf("%w: trust tier %q", ErrInvalidRequest, s.TrustTier)
	}
	if !slices.Contains([]string{"normal", "high"}, s.Risk) {
		return fmt.Errorf("%w: risk %q", ErrInvalidRequest, s.Risk)
	}
	for _, p := range []string{s.Home, s.Workspace} {
		if p != "" {
			if err := validatePath(p); err != nil {
				return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
			}
		}
	}
	return nil
}

// GrantRequest asks for one capability for one session.
type GrantRequest struct {
	Session    string        `json:"session"`
	Capability Capability    `json:"capability"`
	Provenance Provenance    `json:"provenance"`
	Lifecycle  Lifecycle     `json:"lifecycle"`        // once | session (standing is refused)
	TTL        time.Duration `json:"ttl,omitempty"`    // 0: once → DefaultOnceTTL; session → until session end
	Parent     string        `json:"parent,omitempty"` // a handle token: attenuate that grant
	Requester  string        `json:"requester,omitempty"`
}

// Grant is what a caller gets back for an issued grant.
type Grant struct {
	Handle    string    `json:"handle"` // the unforgeable token
	ID        string    `json:"id"`
	Session   string    `json:"session"`
	Tier      Tier      `json:"tier"`
	Lifecycle Lifecycle `json:"lifecycle"`
	Expires   time.Time `json:"expires,omitzero"`
	Parent    string    `json:"parent,omitempty"`
}

// Event is one lifecycle step for the audit trail. It never carries a
// secret: scopes are hashed (ParamsSHA256) and summarized by class.
type Event struct {
	Time         time.Time `json:"time"`
	Kind         string    `json:"kind"` // session.create, grant.request, grant.issue, grant.rollback, grant.revoke, approval.*, breaker.trip, deny, reconcile.*
	Session      string    `json:"session,omitempty"`
	Grant        string    `json:"grant,omitempty"`
	Class        Class     `json:"class,omitempty"`
	Tier         string    `json:"tier,omitempty"`
	Provenance   string    `json:"provenance,omitempty"`
	ParamsSHA256 string    `json:"params_sha256,omitempty"`
	Outcome      string    `json:"outcome,omitempty"`
	Rule         string    `json:"rule,omitempty"`
	Actor        string    `json:"actor,omitempty"`
}

// EventSink receives lifecycle events; an error fails the step that emitted
// it (fail closed).
type EventSink interface {
	Emit(Event) error
}

type slogSink struct{ l *slog.Logger }

func (s slogSink) Emit(e Event) error {
	s.l.Info("shinken event", "kind", e.Kind, "session", e.Session, "grant", e.Grant, "class", e.Class, "tier", e.Tier, "outcome", e.Outcome, "rule", e.Rule)
	return nil
}

// BreakerConfig sets the denial circuit breaker (seeds/permissions.md §6.5).
type BreakerConfig struct {
	Consecutive int // default 3
	Total       int // default 20
}

// Step names one step of GRANT or REVOKE, for crash injection.
type Step string

// The steps a crash can be injected after.
const (
	StepGrantAuthorized   Step = "grant.authorized"    // Cedar said yes
	StepGrantProved       Step = "grant.proved"        // permissiveness check passed
	StepGrantIntent       Step = "grant.intent"        // pending record persisted
	StepGrantHandleIssued Step = "grant.handle-issued" // kernel handle exists, not yet recorded
	StepGrantHandleSaved  Step = "grant.handle-saved"  // kernel ref recorded
	StepGrantRuleApplied  Step = "grant.rule-applied"  // after each kernel rule
	StepGrantDeltaApplied Step = "grant.delta-applied" // all rules in, not yet live
	StepGrantLive         Step = "grant.live"          // live record persisted
	StepGrantEmitted      Step = "grant.emitted"       // event emitted
	StepRevokeFlipped     Step = "revoke.flipped"      // kernel bit flipped, nothing recorded
	StepRevokeIntent      Step = "revoke.intent"       // revoking recorded
	StepRevokePolicy      Step = "revoke.policy"       // Cedar policy removed
	StepRevokeRuleRemoved Step = "revoke.rule-removed" // after each kernel rule
	StepRevokeFreed       Step = "revoke.freed"        // kernel handle freed
	StepRevokeDone        Step = "revoke.done"         // revoked record persisted
	StepRevokeEmitted     Step = "revoke.emitted"      // event emitted
	StepSessionIntent     Step = "session.intent"      // creating record persisted
	StepSessionKernel     Step = "session.kernel"      // kernel cgroup exists, not yet active
)

// GrantSteps and RevokeSteps list the steps in order.
var (
	GrantSteps   = []Step{StepGrantAuthorized, StepGrantProved, StepGrantIntent, StepGrantHandleIssued, StepGrantHandleSaved, StepGrantRuleApplied, StepGrantDeltaApplied, StepGrantLive, StepGrantEmitted}
	RevokeSteps  = []Step{StepRevokeFlipped, StepRevokeIntent, StepRevokePolicy, StepRevokeRuleRemoved, StepRevokeFreed, StepRevokeDone, StepRevokeEmitted}
	SessionSteps = []Step{StepSessionIntent, StepSessionKernel}
)

// DefaultOnceTTL bounds a once grant whose use is never reported.
const DefaultOnceTTL = 5 * time.Minute

// DefaultApprovalTimeout is how long an Ask waits for a human.
const DefaultApprovalTimeout = 10 * time.Minute

// Config configures an Agent.
type Config struct {
	StateDir    string               // required; created 0700
	PolicyDir   string               // optional admin policy directory (*.cedar)
	ManifestDir string               // *.manifest files; or Manifests
	Manifests   map[string]*Manifest // image → manifest (used when ManifestDir is empty)
	Kernel      Kernel               // required
	Breaker     BreakerConfig
	Events      EventSink
	Logger      *slog.Logger
	Now         func() time.Time
	// ApprovalTimeout: an Ask not answered in time does not run (default 10m).
	ApprovalTimeout time.Duration
	// TombstoneRetention is how long revoked and rolled-back grant records
	// are kept (default 24h); Sweep prunes older ones. A pruned grant's token
	// still verifies (the MAC is the agent's), so Revoke stays idempotent.
	TombstoneRetention time.Duration
	// CrashHook, when set, is called after every step of GRANT and REVOKE;
	// tests make it kill the process to check recovery.
	CrashHook func(Step)
}

func (c *Config) validate() error {
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("%w: config: state dir %q must be absolute", ErrInvalidRequest, c.StateDir)
	}
	if c.Kernel == nil {
		return fmt.Errorf("%w: config: no kernel", ErrInvalidRequest)
	}
	if c.Breaker.Consecutive == 0 {
		c.Breaker.Consecutive = 3
	}
	if c.Breaker.Total == 0 {
		c.Breaker.Total = 20
	}
	if c.Breaker.Consecutive < 0 || c.Breaker.Total < 0 {
		return fmt.Errorf("%w: config: breaker thresholds must be positive", ErrInvalidRequest)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Events == nil {
		c.Events = slogSink{c.Logger}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ApprovalTimeout == 0 {
		c.ApprovalTimeout = DefaultApprovalTimeout
	}
	if c.TombstoneRetention == 0 {
		c.TombstoneRetention = 24 * time.Hour
	}
	return nil
}

// Agent is the control plane: decisions, handles, the grant and revoke
// protocol and durable state. Its methods are safe for concurrent use;
// state-changing calls are serialized, Decide is not.
type Agent struct {
	cfg       Config
	engine    *Engine
	kernel    Kernel
	minter    minter
	store     *store
	manifests map[string]*Manifest

	mu sync.Mutex // serializes every state change
	st *state

	bmu     sync.Mutex // breaker counters (hot path of Decide)
	breaker map[string]*BreakerState
}

// Open loads the policies, manifests and persisted state, and reconciles the
// state with the kernel (see Reconcile) before returning.
func Open(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	key, err := loadOrCreateKey(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	eng, err := NewEngine(cfg.PolicyDir)
	if err != nil {
		return nil, err
	}
	manifests := cfg.Manifests
	if cfg.ManifestDir != "" {
		if manifests, err = LoadManifestDir(cfg.ManifestDir); err != nil {
			return nil, err
		}
	}
	a := &Agent{cfg: cfg, engine: eng, kernel: cfg.Kernel, minter: minter{key}, store: &store{dir: cfg.StateDir}, manifests: manifests, breaker: map[string]*BreakerState{}}
	if a.st, err = a.store.load(); err != nil {
		return nil, err
	}
	if _, err := a.Reconcile(); err != nil {
		return nil, err
	}
	return a, nil
}

// Engine returns the decision layer (for policy reloads and inspection).
func (a *Agent) Engine() *Engine { return a.engine }

func (a *Agent) crash(s Step) {
	if a.cfg.CrashHook != nil {
		a.cfg.CrashHook(s)
	}
}

func (a *Agent) persist() error { return a.store.save(a.st) }

func (a *Agent) emit(e Event) error {
	if e.Time.IsZero() {
		e.Time = a.cfg.Now()
	}
	return a.cfg.Events.Emit(e)
}

func paramsHash(c Capability) string {
	b, _ := json.Marshal(c.Normalized())
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func (a *Agent) sessionAttrs(s SessionSpec) SessionAttrs {
	// The policy store: agent state, admin policies and image manifests.
	store := []string{filepath.Clean(a.cfg.StateDir)}
	for _, d := range []string{a.cfg.PolicyDir, a.cfg.ManifestDir} {
		if d != "" {
			if abs, err := filepath.Abs(d); err == nil {
				store = append(store, abs)
			}
		}
	}
	return SessionAttrs{ID: s.ID, Image: s.Image, TrustTier: s.TrustTier, Risk: s.Risk, Headless: s.Headless, TLSInspection: s.TLSInspection,
		Protected: DefaultProtected(s.Home), PolicyStore: store}
}

// CreateSession creates the session's kernel cgroup and records it.
func (a *Agent) CreateSession(spec SessionSpec) error {
	if err := spec.normalize(); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.st.Sessions[spec.ID]; ok {
		return fmt.Errorf("%w: %q", ErrSessionExists, spec.ID)
	}
	rec := &SessionRecord{Spec: spec, Phase: SessionCreating, Created: a.cfg.Now()}
	a.st.Sessions[spec.ID] = rec
	// Only this session's record changes here: persist just that.
	key := "s/" + spec.ID
	if err := a.store.saveKeys(a.st, key); err != nil {
		delete(a.st.Sessions, spec.ID)
		return err
	}
	a.crash(StepSessionIntent)
	if _, err := a.kernel.CreateSession(spec.ID); err != nil {
		delete(a.st.Sessions, spec.ID)
		return errors.Join(fmt.Errorf("%w: create session %s: %w", ErrKernel, spec.ID, err), a.store.saveKeys(a.st, key))
	}
	a.crash(StepSessionKernel)
	rec.Phase = SessionActive
	if err := a.store.saveKeys(a.st, key); err != nil {
		delete(a.st.Sessions, spec.ID)
		return errors.Join(err, a.kernel.DestroySession(spec.ID))
	}
	a.bmu.Lock()
	a.breaker[spec.ID] = &BreakerState{}
	a.bmu.Unlock()
	a.engine.PutSession(a.sessionAttrs(spec))
	return a.emit(Event{Kind: "session.create", Session: spec.ID, Outcome: "ok"})
}

// EndSession revokes every grant of the session, destroys its cgroup and
// forgets it (pending approvals included). Ending an unknown session is an
// error; ending it twice is not possible.
func (a *Agent) EndSession(id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.endSessionLocked(id, "session ended")
}

func (a *Agent) endSessionLocked(id, reason string) error {
	rec, ok := a.st.Sessions[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSession, id)
	}
	rec.Phase = SessionEnding
	if err := a.persist(); err != nil {
		return err
	}
	var errs []error
	// Oldest first: a root is revoked before its descendants, and revoking
	// it takes its whole subtree (descendants in other sessions included).
	for _, g := range a.sortedGrants() {
		if g.Session == id && !g.Phase.Terminal() {
			errs = append(errs, a.revokeLocked(g, reason))
		}
	}
	for k, ap := range a.st.Approvals {
		if ap.Request.Session == id {
			delete(a.st.Approvals, k)
		}
	}
	if err := a.kernel.DestroySession(id); err != nil && !errors.Is(err, backend.ErrSessionNotFound) {
		errs = append(errs, fmt.Errorf("%w: destroy session %s: %w", ErrKernel, id, err))
	}
	if err := errors.Join(errs...); err != nil {
		return errors.Join(err, a.persist())
	}
	delete(a.st.Sessions, id)
	a.engine.DropSession(id)
	a.bmu.Lock()
	delete(a.breaker, id)
	a.bmu.Unlock()
	if err := a.persist(); err != nil {
		return err
	}
	return a.emit(Event{Kind: "session.end", Session: id, Outcome: reason})
}

func (a *Agent) sortedGrants() []*GrantRecord {
	out := make([]*GrantRecord, 0, len(a.st.Grants))
	for _, g := range a.st.Grants {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Sessions lists the active sessions' specs.
func (a *Agent) Sessions() []SessionSpec {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []SessionSpec
	for _, s := range a.st.Sessions {
		if s.Phase == SessionActive {
			out = append(out, s.Spec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

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

// Grant runs the pre-grant gate and, for Auto and Notify tiers, the GRANT
// sequence. An Ask-tier request creates a pending approval and returns an
// *ApprovalRequiredError; Block is refused. Every refusal counts towards the
// session's denial circuit breaker. A failure at any step rolls the whole
// grant back.
func (a *Agent) Grant(ctx context.Context, req GrantRequest) (*Grant, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
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
	return a.Grant(ctx, req)
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
	if rec.Tier == TierBlock {
		return nil, fmt.Errorf("%w: %s", ErrBlockTier, c)
	}
	if err := a.enforceable(c.Class); err != nil {
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
		if perr := a.persist(); perr != nil {
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
	if err := ProveGrant(gd, now); err != nil {
		return nil, err
	}
	a.crash(StepGrantProved)
	// 3. Issue the handle: intent first, then the kernel, then the record.
	rec.Phase = PhasePending
	a.st.Grants[id] = rec
	if err := a.persist(); err != nil {
		delete(a.st.Grants, id)
		return nil, err
	}
	a.crash(StepGrantIntent)
	var parentRef backend.HandleRef
	if rec.Parent != "" {
		parentRef = a.st.Grants[rec.Parent].Kernel
	}
	ref, err := a.kernel.NewHandle(parentRef, rec.Expires)
	if err != nil {
		return nil, a.rollback(rec, fmt.Errorf("%w: new handle: %w", ErrKernel, err))
	}
	rec.Kernel = ref
	a.crash(StepGrantHandleIssued)
	rec.Phase = PhaseHandle
	if err := a.persist(); err != nil {
		return nil, a.rollback(rec, err)
	}
	a.crash(StepGrantHandleSaved)
	// 4. Push the OS delta: record what may land in the kernel, then push.
	rules := egressRules(c, ref)
	rec.Rules = rules
	rec.Phase = PhaseApplying
	if err := a.persist(); err != nil {
		return nil, a.rollback(rec, err)
	}
	// One rule per Apply: a crash between two leaves a prefix of the
	// recorded rules in the kernel, which reconcile removes.
	for _, r := range rules {
		if err := a.kernel.Apply(rec.Session, backend.Delta{AddEgress: []backend.EgressRule{r}}); err != nil {
			return nil, a.rollback(rec, fmt.Errorf("%w: allow egress %s: %w", ErrKernel, r, err))
		}
		a.crash(StepGrantRuleApplied)
	}
	a.crash(StepGrantDeltaApplied)
	if err := a.engine.PutGrant(gd); err != nil {
		return nil, a.rollback(rec, err)
	}
	rec.Phase = PhaseLive
	sess := a.st.Sessions[rec.Session]
	oldIng := sess.Ingredients
	sess.Ingredients = sess.Ingredients.With(c, rec.Provenance)
	if err := a.persist(); err != nil {
		sess.Ingredients = oldIng
		return nil, a.rollback(rec, err)
	}
	a.crash(StepGrantLive)
	// 5. Emit the event; failing to record it fails the grant.
	if err := a.emit(Event{Kind: "grant.issue", Session: rec.Session, Grant: id, Class: c.Class, Tier: rec.Tier.String(), Provenance: string(rec.Provenance),
		ParamsSHA256: paramsHash(c), Actor: rec.Approver, Outcome: "live"}); err != nil {
		sess.Ingredients = oldIng
		return nil, a.rollback(rec, fmt.Errorf("emit: %w", err))
	}
	a.crash(StepGrantEmitted)
	if rec.Tier == TierNotify {
		a.emit(Event{Kind: "grant.notify", Session: rec.Session, Grant: id, Class: c.Class, Tier: rec.Tier.String()})
	}
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
	if len(errs) == 0 {
		if err := a.kernel.Release(rec.Session, rec.Kernel, rec.Rules); err != nil && !handleGone(err) {
			errs = append(errs, err)
		}
	}
	a.engine.RemoveGrant(rec.Session, rec.ID)
	if len(errs) == 0 {
		rec.Phase = PhaseRolledBack
	} else {
		rec.Phase = PhaseRevoking // reconcile finishes the teardown
	}
	rec.Ended = a.cfg.Now()
	rec.EndReason = "rollback: " + cause.Error()
	errs = append(errs, a.persist())
	a.emit(Event{Kind: "grant.rollback", Session: rec.Session, Grant: rec.ID, Class: rec.Capability.Class, Outcome: cause.Error()})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w (rollback incomplete: %v)", cause, err)
	}
	return cause
}

func handleGone(err error) bool {
	return errors.Is(err, backend.ErrInvalidHandle) || errors.Is(err, backend.ErrHandleNotLive)
}

// Revoke runs the REVOKE sequence on the grant behind a handle token and on
// every grant attenuated from it (the membrane). The kernel handle's state
// word is flipped first: from that write on, the kernel denies the grant and
// all its descendants. Revoking a revoked handle succeeds (idempotent); a
// forged token is refused.
func (a *Agent) Revoke(ctx context.Context, token string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
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
func (a *Agent) RevokeGrant(ctx context.Context, id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.st.Grants[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownHandle, id)
	}
	return a.revokeLocked(g, "revoked")
}

// Consume reports the one use of a once grant, which revokes it; for other
// lifecycles it only checks the handle is live.
func (a *Agent) Consume(ctx context.Context, token string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
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

// descendants returns every grant attenuated (transitively) from g, deepest
// last.
func (a *Agent) descendants(g *GrantRecord) []*GrantRecord {
	var out []*GrantRecord
	frontier := []string{g.ID}
	for len(frontier) > 0 {
		var next []string
		for _, c := range a.sortedGrants() {
			if slices.Contains(frontier, c.Parent) {
				out = append(out, c)
				next = append(next, c.ID)
			}
		}
		frontier = next
	}
	return out
}

func (a *Agent) revokeLocked(g *GrantRecord, reason string) error {
	if g.Phase.Terminal() {
		return nil
	}
	subtree := append([]*GrantRecord{g}, a.descendants(g)...)
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
		}
	}
	if err := a.persist(); err != nil {
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
	if err := a.persist(); err != nil {
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

// teardown reclaims a dead grant's kernel state: its rules, one at a time
// (a crash between two leaves the rest for reconcile), then its slot. The
// grant's handle, or an ancestor's, must already be revoked. Every step
// tolerates "already gone".
func (a *Agent) teardown(x *GrantRecord) error {
	for _, r := range x.Rules {
		if err := a.kernel.Release(x.Session, backend.HandleRef{}, []backend.EgressRule{r}); err != nil {
			return fmt.Errorf("%w: remove egress %s: %w", ErrKernel, r, err)
		}
		a.crash(StepRevokeRuleRemoved)
	}
	if err := a.kernel.Release(x.Session, x.Kernel, nil); err != nil && !handleGone(err) {
		return fmt.Errorf("%w: free %s: %w", ErrKernel, x.Kernel, err)
	}
	return nil
}

// Sweep revokes grants whose expiry has passed (the kernel already denies
// them; this tears their state down), retries revocations whose teardown
// failed, ends expired sessions and times out stale approvals. The daemon
// calls it periodically.
func (a *Agent) Sweep(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.cfg.Now()
	var errs []error
	for _, g := range a.sortedGrants() {
		switch {
		case g.Phase == PhaseLive && !g.Expires.IsZero() && !now.Before(g.Expires):
			errs = append(errs, a.revokeLocked(g, "expired"))
		case g.Phase == PhaseRevoking: // a teardown that failed earlier: retry
			errs = append(errs, a.revokeLocked(g, g.EndReason))
		}
	}
	for _, id := range sortedKeys(a.st.Sessions) {
		rec := a.st.Sessions[id]
		if rec.Phase == SessionActive && !rec.Spec.Expires.IsZero() && !now.Before(rec.Spec.Expires) {
			errs = append(errs, a.endSessionLocked(id, "session expired"))
		}
	}
	changed := false
	for id, g := range a.st.Grants {
		if g.Phase.Terminal() && now.Sub(g.Ended) > a.cfg.TombstoneRetention {
			delete(a.st.Grants, id)
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
	return errors.Join(errs...)
}

// ReloadPolicies re-reads the policy directory (see Engine.Reload): a
// directory with errors, or an edit that widens authority without
// opts.AllowWiden, leaves the previous set in force.
func (a *Agent) ReloadPolicies(opts ReloadOptions) (*ShiftReport, error) {
	rep, err := a.engine.Reload(opts)
	out := "ok"
	if err != nil {
		out = err.Error()
	} else if rep.Widens() {
		out = "accepted widening: " + rep.Counterexample.String()
	}
	a.emit(Event{Kind: "policy.reload", Outcome: out})
	return rep, err
}

// NoteIngredients records ingredients of the "at most two of three" rule
// that the agent cannot see itself (the tool runner labels a turn that
// ingested external content; the broker reports credential access). Flags
// only accumulate for the session's life.
func (a *Agent) NoteIngredients(session string, in Ingredients) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec, ok := a.st.Sessions[session]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	old := rec.Ingredients
	rec.Ingredients.ExternalIngestion = old.ExternalIngestion || in.ExternalIngestion
	rec.Ingredients.CredentialAccess = old.CredentialAccess || in.CredentialAccess
	rec.Ingredients.ExternalCommunication = old.ExternalCommunication || in.ExternalCommunication
	if err := a.persist(); err != nil {
		rec.Ingredients = old
		return err
	}
	return nil
}

// ReloadManifests re-reads Config.ManifestDir. On any error (reported with
// file:line) the previous manifests stay in force. Live grants are not
// re-checked: narrowing a manifest affects later requests; revoke what must
// go.
func (a *Agent) ReloadManifests() error {
	if a.cfg.ManifestDir == "" {
		return fmt.Errorf("%w: no manifest directory configured", ErrInvalidRequest)
	}
	ms, err := LoadManifestDir(a.cfg.ManifestDir)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.manifests = ms
	a.mu.Unlock()
	a.emit(Event{Kind: "manifest.reload", Outcome: fmt.Sprintf("%d images", len(ms))})
	return nil
}

// PendingApprovals lists the Asks waiting for a human.
func (a *Agent) PendingApprovals() []ApprovalRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
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
	defer a.mu.Unlock()
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
	defer a.mu.Unlock()
	ap, err := a.takeApproval(id)
	if err != nil {
		return err
	}
	a.emit(Event{Kind: "approval.deny", Session: ap.Request.Session, Class: ap.Request.Capability.Class, Actor: approver, Outcome: id})
	a.denied(ap.Request.Session, ErrDenied)
	return nil
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
		a.mu.Unlock()
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
	defer a.mu.Unlock()
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
	defer a.mu.Unlock()
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

// GrantInfo is a read-only view of one grant.
type GrantInfo struct {
	ID         string            `json:"id"`
	Session    string            `json:"session"`
	Capability Capability        `json:"capability"`
	Tier       Tier              `json:"tier"`
	Provenance Provenance        `json:"provenance"`
	Lifecycle  Lifecycle         `json:"lifecycle"`
	Expires    time.Time         `json:"expires,omitzero"`
	Parent     string            `json:"parent,omitempty"`
	Phase      GrantPhase        `json:"phase"`
	Kernel     backend.HandleRef `json:"kernel"`
}

// Grants lists the session's grants ("" for all), tombstones included.
func (a *Agent) Grants(session string) []GrantInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []GrantInfo
	for _, g := range a.sortedGrants() {
		if session == "" || g.Session == session {
			out = append(out, GrantInfo{ID: g.ID, Session: g.Session, Capability: g.Capability, Tier: g.Tier, Provenance: g.Provenance,
				Lifecycle: g.Lifecycle, Expires: g.Expires, Parent: g.Parent, Phase: g.Phase, Kernel: g.Kernel})
		}
	}
	return out
}

// DNSPolicy derives the allowlisting resolver's policy for session from its
// live net.egress grants: one resolver grant per domain × port range, under
// the grant's kernel handle. A grant that names domains and CIDRs together
// lets its names resolve into those CIDRs even when they are not public (an
// internal service); otherwise the resolver strips non-public answers. ok is
// false when the session does not exist (the resolver should drop it).
func (a *Agent) DNSPolicy(session string) (p dnsresolver.Policy, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, found := a.st.Sessions[session]; !found || s.Phase != SessionActive {
		return p, false
	}
	for _, g := range a.sortedGrants() {
		if g.Session != session || g.Phase != PhaseLive || g.Capability.Class != ClassNetEgress || g.Capability.Egress == nil {
			continue
		}
		e := g.Capability.Egress
		var nonPublic []netip.Prefix
		for _, c := range e.CIDRs {
			if !dnsresolver.IsPublic(c.Addr()) {
				nonPublic = append(nonPublic, c)
			}
		}
		for _, dom := range e.Domains {
			for _, pr := range e.portRanges() {
				p.Grants = append(p.Grants, dnsresolver.Grant{Pattern: dom, Handle: g.Kernel, Proto: backend.ProtoAny, Ports: pr, AllowNonPublic: nonPublic})
			}
		}
	}
	return p, true
}

// EgressDomains returns the domain patterns of the session's live net.egress
// grants with their kernel handles, for the DNS resolver to open.
func (a *Agent) EgressDomains(session string) map[string][]backend.HandleRef {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][]backend.HandleRef{}
	for _, g := range a.st.Grants {
		if g.Session == session && g.Phase == PhaseLive && g.Capability.Class == ClassNetEgress {
			for _, d := range g.Capability.Egress.Domains {
				out[d] = append(out[d], g.Kernel)
			}
		}
	}
	return out
}
