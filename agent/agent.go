package agent

// The Agent: configuration, opening (state loaded, then reconciled with the
// backend), lifecycle events, and policy and manifest reloads. The layers it
// ties together are in their own files (see README.md, "Layout").

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/policy"
	"github.com/shinken-agent/shinken/agent/store"
	"github.com/shinken-agent/shinken/dnsresolver"
)

// EventSink receives lifecycle events; an error fails the step that emitted
// it (fail closed).
type EventSink interface {
	Emit(Event) error
}

// Committer is an EventSink that can hold records back from stable
// storage: Emit of an Event with Defer set may return once the record is
// written, and Commit makes every record emitted before it durable, several
// with one sync (the audit log's group commit), then calls then (when not
// nil); Commit returns when both are done, with their errors joined,
// and does not call then when the records could not be made durable. What
// the sink does once the records are durable (the audit log's checkpoint,
// which trails its syncs) is not waited for. The agent commits a grant's records (request, issue) and writes
// its live record to the journal inside then, so a crash never leaves a
// live grant the audit log does not show; it commits before answering any
// call whose events it deferred. A sink that is not a Committer is taken to
// write every event durably before Emit returns.
type Committer interface {
	EventSink
	Commit(then func() error) error
}

// BesideCommitter is a Committer that can run the agent's journal write
// beside its own sync instead of after it (the audit log's CommitBeside):
// CommitBeside calls then at once with the mark of the last record written
// so far (the audit log's seq and the record's hash) and returns when both
// then and the sync are done, with their errors joined; it does not call
// then when the sink already knows it cannot make records durable. The
// agent writes a grant's live record inside then with the mark in it
// (GrantRecord.AuditMark and AuditHash), so the journal's fsync overlaps
// the log's fdatasync instead of following it (the log's checkpoint
// trails the log's, and nothing waits for it). A power loss while both run may keep the live record
// and lose the records, so at start the agent asks HasRecord for every
// live grant's mark (whether the log holds that very record: the seq
// alone does not say, since the log gives a lost record's seq to the next
// record it writes; attached false when no log is attached) and treats
// every live grant whose record the log does not hold as never live:
// reconcile rolls it back (checkAuditMarks).
type BesideCommitter interface {
	Committer
	CommitBeside(then func(seq uint64, hash string) error) error
	HasRecord(seq uint64, hash string) (held, attached bool, err error)
}

// logFold says how a background fold of the state journal went (agent/store:
// the journal is rotated to a segment on the writer's path and folded into
// a snapshot on a goroutine). A failed fold loses nothing (its segments are
// replayed at the next start and folded at the next rotation), but a disk
// that keeps failing it lets the journal grow: an operator should hear.
func logFold(l *slog.Logger, f store.Fold) {
	switch {
	case f.Err != nil && f.Through == 0:
		l.Error("state journal: rotation failed; writes go on in the journal as it was", "err", f.Err)
	case f.Err != nil:
		l.Error("state journal: fold failed; its segments stay and are folded at the next rotation", "through", f.Through, "err", f.Err)
	default:
		l.Debug("state journal folded", "through", f.Through, "snapshot_bytes", f.Bytes, "took", f.Took)
	}
}

type slogSink struct{ l *slog.Logger }

func (s slogSink) Emit(e Event) error {
	s.l.Info("shinken event", "kind", e.Kind, "session", e.Session, "grant", e.Grant, "class", e.Class, "tier", e.Tier, "outcome", e.Outcome, "rule", e.Rule)
	return nil
}

// Config configures an Agent.
type Config struct {
	StateDir  string // required; created 0700
	PolicyDir string // optional admin policy directory (*.cedar)
	// AcceptPolicyWidening starts the agent even when the policy on disk is
	// wider than the last applied set (an operator's edit made while it was
	// down); the acceptance is an audited event. Without it such a start
	// fails with ErrPolicyWidens.
	AcceptPolicyWidening bool
	// NeverList is what the backend refuses besides
	// backend.DefaultNeverList (the daemon's own listeners); the agent marks
	// a grant's rule NeverOK only for a destination an admin policy names.
	NeverList   []backend.NeverEntry
	ManifestDir string               // *.manifest files; or Manifests
	Manifests   map[string]*Manifest // image → manifest (used when ManifestDir is empty)
	Kernel      Kernel               // required
	Breaker     BreakerConfig
	Events      EventSink
	Logger      *slog.Logger
	Now         func() time.Time
	// ApprovalTimeout: an Ask not answered in time does not run (default 10m).
	ApprovalTimeout time.Duration
	// TombstoneRetention is how long revoked and rolled-back grant records,
	// and decided cards (counted from their expiry), are kept (default
	// 24h); Sweep prunes older ones. A pruned grant's token
	// still verifies (the MAC is the agent's), so Revoke stays idempotent.
	TombstoneRetention time.Duration
	// TombstonesPerSession caps the tombstones kept for one session: past
	// it, Sweep prunes the session's oldest first, whatever their age
	// (default DefaultTombstonesPerSession). Without it an operator's
	// grant and revoke loop held every record for the retention: about 1.6 KiB
	// of heap and a look each second from Sweep per tombstone (bench-neighbor's
	// 8,000 in four minutes: 13 MiB). The audit log keeps every grant and
	// revoke for good; a pruned grant's token still revokes (see above).
	TombstonesPerSession int
	// EscalationCards caps each session's pending escalation cards (cards
	// opened for kernel denials; see escalate_cap.go). Default
	// DefaultEscalationCards.
	EscalationCards int
	// CrashHook, when set, is called after every step of GRANT and REVOKE;
	// tests make it kill the process to check recovery.
	CrashHook func(Step)
	// StoreFault, when set, is the journal's fault hook from Open on
	// (store.Store.Fault): tests make a write at start fail as ENOSPC or
	// EIO would.
	StoreFault func(op string) error

	// WorkspaceProtected names paths, relative to a session's workspace,
	// kept read-only in its view besides WorkspaceProtected (.git/hooks,
	// .git/config) and the agent's own files.
	WorkspaceProtected []string
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
	if c.EscalationCards == 0 {
		c.EscalationCards = DefaultEscalationCards
	}
	if c.TombstonesPerSession == 0 {
		c.TombstonesPerSession = DefaultTombstonesPerSession
	}
	if c.TombstonesPerSession < 0 {
		return fmt.Errorf("%w: config: tombstones per session %d must be positive", ErrInvalidRequest, c.TombstonesPerSession)
	}
	if c.EscalationCards < 0 {
		return fmt.Errorf("%w: config: escalation cards %d must be positive", ErrInvalidRequest, c.EscalationCards)
	}
	return nil
}

// Agent is the control plane: decisions, handles, the grant and revoke
// protocol and durable state. Its methods are safe for concurrent use;
// state-changing calls are serialized, Decide is not.
//
// The locks, and what each protects:
//   - mu orders every state change with the kernel writes it makes: the
//     records (st), their writes to the store, the backend calls of grant,
//     revoke, session create and end, reconcile and the never-list, and
//     the resolver's dirty set (dns, dnsDirty). Under it a grant still runs
//     the pre-grant gate, Cedar's grant authorization (it reads the
//     session's entities, which grants change) and one commit of its audit
//     records (Committer: one fdatasync; the log's checkpoint trails it,
//     off the grant's path) beside which its live record is written and
//     fsynced (BesideCommitter; with a plain Committer, once the
//     fdatasync has returned; intent records are written unsynced:
//     persistIntent).
//     The grant proof runs before it is taken (prove.go); use-time
//     decisions (Decide, DecideUse) never take it.
//   - bmu guards the breaker counters, which Decide moves without mu.
//   - policyMu serializes policy changes (apply, reload); the engine swaps
//     its set atomically, so decisions never wait for it.
//   - proofs.mu guards the proof cache only.
type Agent struct {
	cfg       Config
	engine    *Engine
	kernel    Kernel
	minter    minter
	store     *store.Store // the durable state (agent/store); st is its State
	manifests map[string]*Manifest

	mu sync.Mutex // serializes every state change
	st *store.State

	never []backend.NeverEntry // under mu: the never-list in force (SetNeverList)
	// neverExtra and hostNever are the parts of never the daemon sets
	// (SetNeverList's extra, SetHostAddrs's entries); under mu.
	neverExtra, hostNever []backend.NeverEntry
	// neverView is never as Decide reads it (no lock); neverRules holds
	// each grant's NeverOK rules (grant id -> []backend.EgressRule), for
	// Decide too (never.go).
	neverView  atomic.Pointer[[]backend.NeverEntry]
	neverRules sync.Map
	forbids    policy.KernelForbids // under mu: the deny table in force and the forbids only Decide enforces (forbids.go)

	dns      DNSTarget                     // under mu; nil: no resolver attached
	dnsDirty map[string]struct{}           // under mu: sessions whose resolver policy may have changed
	dnsGiven map[string]dnsresolver.Policy // under mu: the policy each session's resolver has now (unlock)
	// bySession indexes st.Grants by session (tombstones included), under
	// mu (grantindex.go): what a session's grants cost to find is its own
	// grants, not every grant the state keeps.
	bySession  grantIndex
	children   grantIndex // under mu: parent grant id → its attenuations (grantindex.go)
	due        dueIndex   // under mu: what the sweep may have to act on (dueindex.go)
	dnsVisited uint64     // grant records dnsGrants examined, under mu (tests)

	proofs proofs // grant proofs already made (prove.go); its own lock

	bmu    sync.Mutex           // breaker counters (hot path of Decide)
	bdirty map[string]struct{}  // under bmu: sessions whose breaker moved since the last state write
	kdWins map[string]*kdWindow // under bmu: kernel denials already counted this window (kdeny.go)
	// policyMu serializes policy changes (apply, reload).
	policyMu sync.Mutex
	esc      escalations // kernel denials turned into cards
	pauses   pauses      // sessions frozen (pause.go)
	breaker  map[string]*BreakerState
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
	db, err := store.Open(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	db.Fault = cfg.StoreFault
	db.OnFold = func(f store.Fold) { logFold(cfg.Logger, f) }
	a := &Agent{cfg: cfg, engine: eng, kernel: cfg.Kernel, minter: minter{key}, store: db, st: db.State(), manifests: manifests, breaker: map[string]*BreakerState{}, bdirty: map[string]struct{}{}, kdWins: map[string]*kdWindow{},
		dnsDirty: map[string]struct{}{}, dnsGiven: map[string]dnsresolver.Policy{}, bySession: newGrantIndex(db.State().Grants),
		children: newChildIndex(db.State().Grants), due: newDueIndex(db.State())}
	if err := a.start(); err != nil {
		db.Close() // the journal is not left open by an agent that never started
		return nil, err
	}
	return a, nil
}

// start is Open's work once the state is loaded: the restart policy check,
// the never-list, reconcile, the cards.
func (a *Agent) start() error {
	if err := a.checkRestartPolicy(); err != nil {
		return err
	}
	// The agent owns the never-list: the backend's is set from the config
	// before anything is reconciled or granted.
	if err := a.setNeverLocked(nil); err != nil {
		return err
	}
	// So does the deny table (the forbids in force), before any grant.
	if err := a.setDenyList(a.engine.KernelForbids()); err != nil {
		return err
	}
	if err := a.checkAuditMarks(); err != nil {
		return err
	}
	if _, err := a.Reconcile(); err != nil {
		return err
	}
	// Every live grant's never-list exceptions, from the admin permits in
	// force (they may have changed while the agent was down).
	a.mu.Lock()
	err := a.rederiveNever()
	a.unlock()
	if err != nil {
		return err
	}
	a.learnPaused()
	return a.openCards()
}

// Engine returns the decision layer (for policy reloads and inspection).
func (a *Agent) Engine() *Engine { return a.engine }

func (a *Agent) crash(s Step) {
	if a.cfg.CrashHook != nil {
		a.cfg.CrashHook(s)
	}
}

// persist writes every record that changed (found by encoding each one:
// it costs the whole state) and fsyncs once. The hot paths name what they
// changed instead (persistKeys).
func (a *Agent) persist() error {
	a.syncBreakers()
	return a.store.WriteAll()
}

// persistKeys writes the records named by keys (store.GrantKey,
// store.SessionKey, store.ApprovalKey ...), and the sessions whose breaker
// moved, and fsyncs: a call that knows what it changed pays for that, not
// for the whole state.
func (a *Agent) persistKeys(keys ...string) error {
	return a.store.Write(append(keys, a.syncBreakers()...), true)
}

// persistIntent is persistKeys without the fsync, for intent records whose
// loss reconcile repairs in the fail-closed direction (a pending grant, a
// handle recorded, a Delta about to be pushed, a revocation begun: kernel
// state nobody accounts for is revoked and released at the next start; a
// power loss that drops the record drops the kernel state with it). The
// write still reaches the page cache before the kernel step, so a kill -9
// leaves it for reconcile to report.
func (a *Agent) persistIntent(keys ...string) error {
	return a.store.Write(append(keys, a.syncBreakers()...), false)
}

func (a *Agent) emit(e Event) error {
	if e.Time.IsZero() {
		e.Time = a.cfg.Now()
	}
	a.markDNS(e)
	return a.cfg.Events.Emit(e)
}

// commit makes the deferred events durable (Committer), then runs then
// (nil: nothing), and returns both errors.
func (a *Agent) commit(then func() error) error {
	if c, ok := a.cfg.Events.(Committer); ok {
		return c.Commit(then)
	}
	if then != nil {
		return then()
	}
	return nil
}

// commitLive makes the deferred events durable and writes a live record
// with live: beside the sink's sync when it is a BesideCommitter (live
// gets the mark to record), after it otherwise (mark 0, no hash).
func (a *Agent) commitLive(live func(seq uint64, hash string) error) error {
	if c, ok := a.cfg.Events.(BesideCommitter); ok {
		return c.CommitBeside(live)
	}
	return a.commit(func() error { return live(0, "") })
}

func paramsHash(c Capability) string {
	b, _ := json.Marshal(c.Normalized())
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func (a *Agent) sortedGrants() []*GrantRecord { return sortGrants(a.st.Grants) }

// sortedOf is sortedGrants of one session's grants (bySession).
func (a *Agent) sortedOf(session string) []*GrantRecord { return sortGrants(a.bySession[session]) }

// sortGrants returns grants oldest first (by creation, then id).
func sortGrants(grants map[string]*GrantRecord) []*GrantRecord {
	out := make([]*GrantRecord, 0, len(grants))
	for _, g := range grants {
		out = append(out, g)
	}
	slices.SortFunc(out, grantOrder)
	return out
}

// grantOrder orders grants oldest first: by creation, then id.
func grantOrder(x, y *GrantRecord) int {
	if c := x.Created.Compare(y.Created); c != 0 {
		return c
	}
	return strings.Compare(x.ID, y.ID)
}

// ReloadPolicies re-reads the policy directory (as Engine.Reload does): a
// directory with errors, or an edit that widens authority without
// opts.AllowWiden, leaves the previous set in force. The new set's deny
// table is in the kernel before the engine decides by it, and the live
// grants' never-list exceptions are re-derived (forbids.go).
func (a *Agent) ReloadPolicies(opts ReloadOptions) (*ShiftReport, error) {
	a.policyMu.Lock()
	defer a.policyMu.Unlock()
	rep, err := a.reload(opts)
	if err == nil {
		a.dnsDecisionsChanged() // the set was replaced
	}
	out := rep.Summary()
	if err != nil {
		out = err.Error()
	} else if rep.Widens() {
		out = "accepted " + out
	}
	if err == nil {
		err = a.recordApplied()
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
	defer a.unlock()
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
	a.esc.mu.Lock() // a.mu, then a.esc.mu: escalates asks the new manifests
	clear(a.esc.classes)
	a.esc.mu.Unlock()
	a.unlock()
	a.emit(Event{Kind: "manifest.reload", Outcome: fmt.Sprintf("%d images", len(ms))})
	return nil
}

// Close releases the state journal. The agent must not be used afterwards.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.unlock()
	return a.store.Close()
}
