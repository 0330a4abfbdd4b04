package memory

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The kernel ABI limits the Linux backend has (bpf/shinken_api.bpf.h), kept
// here so the model refuses what the kernel refuses.
const (
	MaxChain = 8 // handle plus ancestors a check walks
	MaxRules = 4 // rules on one (session, prefix) entry
	MaxCover = 8 // covering prefixes one lookup visits
)

// Mechanism names the memory backend in every probe row it fills.
const Mechanism = "memory (test double: enforces nothing on the host)"

// Config sizes the tables and sets the clock. The zero value is the Linux
// backend's defaults with the wall clock.
type Config struct {
	MaxSessions uint32 // session indexes are 1..MaxSessions-1; default 65536
	MaxHandles  uint32 // handle slots are 1..MaxHandles-1; default 262144
	MaxEgress4  int    // IPv4 entries in each of the prefix and exact tables; default 2097152
	MaxEgress6  int    // IPv6 entries likewise; default 1048576
	// Now is the clock deadlines are compared with (default time.Now).
	Now func() time.Time
	// RefuseControllers names quota controllers (Limits.Controllers) the
	// modelled host lacks: CheckLimits and CreateSession refuse a quota
	// needing one with ErrLimitsUnsupported, as the Linux backend does on a
	// hybrid cgroup host. Empty: every quota is accepted and recorded.
	RefuseControllers []string
	// FileNever are the credential locations no file entry opens (Open
	// refuses every path under them), as backend.Config.FileNever.
	FileNever []string
	// FileNeverFixed are the credential locations among FileNever that no
	// admin override lifts (the agent's own), as the Linux backend's
	// backend.Config.FileNeverExtra.
	FileNeverFixed []string
	// Classes, when set, replaces the probe's class rows (to test the
	// agent's gate against a host that lacks a class).
	Classes []backend.Strength
	// EventBuffer is how many denial events each open reader holds before
	// further ones are dropped and counted (default 1024).
	EventBuffer int
	// MaxDNSEntries caps each session's DNS-derived entries (those holding
	// a rule with an expiry) as the Linux backend does (default 4096): a
	// new one past it is refused with backend.ErrEntryCap once the
	// session's expired rules are dropped (the Linux collector's work).
	MaxDNSEntries int
	// MaxProcs is the host's process bound of every session (the Linux
	// backend's RLIMIT_NPROC; default DefaultMaxProcs).
	MaxProcs uint32
}

func (c *Config) setDefaults() {
	if c.MaxSessions == 0 {
		c.MaxSessions = 65536
	}
	if c.MaxHandles == 0 {
		c.MaxHandles = 262144
	}
	if c.MaxEgress4 == 0 {
		c.MaxEgress4 = 2 << 20
	}
	if c.MaxEgress6 == 0 {
		c.MaxEgress6 = 1 << 20
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = 1024
	}
	if c.MaxDNSEntries == 0 {
		c.MaxDNSEntries = 4096
	}
}

func (c *Config) validate() error {
	if c.MaxSessions < 2 || c.MaxHandles < 2 {
		return fmt.Errorf("memory backend config: max sessions %d and max handles %d must be at least 2", c.MaxSessions, c.MaxHandles)
	}
	if c.MaxEgress4 < 0 || c.MaxEgress6 < 0 || c.EventBuffer < 0 || c.MaxDNSEntries < 0 {
		return errors.New("memory backend config: negative table size")
	}
	return nil
}

// Backend is the in-memory backend. Its methods are safe for concurrent
// use; one mutex orders every change, as the Linux backend's does.
type Backend struct {
	cfg    Config
	report backend.Report

	mu        sync.Mutex
	sessions  map[string]*session
	byIndex   map[uint32]*session
	indices   idPool
	cgroupIDs uint64 // last id given to a session (never reused)
	handles   []slot // by slot number; grows with the pool
	slots     idPool
	never     []backend.NeverEntry
	denyTable map[netip.Prefix][]backend.DenyRange // SetDenyList's, pushed down
	denyOps   uint64                               // deny-table entries written or deleted, for tests
	neverOKs  map[neverKey]*neverOK
	dnsPort   uint16
	counters  map[uint32]*backend.Denials
	nEntries  [4]int // entries: egress4, exact4, egress6, exact6
	ops       backend.Ops
	sweeps    backend.SweepStats
	faults    map[Op]*fault
	events    eventHub
}

var _ backend.Backend = (*Backend)(nil)

// New returns an empty backend: no session, no handle, the default
// never-list in force, DNS redirection off.
func New(cfg Config) (*Backend, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Backend{
		cfg:      cfg,
		sessions: map[string]*session{},
		byIndex:  map[uint32]*session{},
		indices:  newIDPool("sessions", cfg.MaxSessions),
		handles:  make([]slot, 1),
		slots:    newIDPool("handles", cfg.MaxHandles),
		never:    slices.Clone(backend.DefaultNeverList),
		neverOKs: map[neverKey]*neverOK{},
		counters: map[uint32]*backend.Denials{0: {}},
		faults:   map[Op]*fault{},
	}
	b.events.init(cfg.EventBuffer)
	b.report = b.probe()
	return b, nil
}

// MustNew is New for tests: it panics on a bad Config.
func MustNew(cfg Config) *Backend {
	b, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// modelled is the model's probe table: the classes it holds a table for,
// each at the level the Linux backend gives it, with the mechanism. A class
// the model gains adds its row here; every other class is reported
// unavailable.
var modelled = map[backend.Class]backend.Strength{
	backend.ClassNetEgress:   {Level: backend.RevocableInKernel, Mechanism: "per-session egress tables checked by Connect against the grant's handle chain"},
	backend.ClassNetInbound:  {Level: backend.RevocableInKernel, Mechanism: "per-session inbound rules checked by Accept against the grant's handle chain"},
	backend.ClassPersistence: {Level: backend.RevocableAtNextUse, Mechanism: "per-session persistent-path entries checked by Open as writes (the Linux mount view's per-name directories; their content is not modelled)"},
	backend.ClassFSScope:     {Level: backend.RevocableAtNextUse, Mechanism: "per-session file entries checked by Open against the grants' handle chains (the Linux mount view, derived again at every change)"},
	backend.ClassProcess:     {Level: backend.RevocableAtNextUse, Mechanism: "per-session process entries checked by Exec and ProcessBound against the grants' handle chains (the Linux exec gate and RLIMIT_NPROC)"},
}

// probe builds the report: what the model holds, and that it confines
// nothing on this host.
func (b *Backend) probe() backend.Report {
	r := backend.Report{OS: runtime.GOOS, Backend: "memory", Facts: map[string]string{
		"enforces":   "nothing on this host: an in-memory model of the Linux backend's tables, for tests",
		"use_checks": "(*memory.Backend).Connect and Accept evaluate the tables as the kernel hooks do",
		"max_chain":  fmt.Sprint(MaxChain),
		"max_rules":  fmt.Sprint(MaxRules),
		"max_cover":  fmt.Sprint(MaxCover),
	}}
	why := "a test double: no process on this host is confined; the level is the one the Linux backend gives this class, held by the model"
	for _, c := range backend.Classes {
		if m, ok := modelled[c]; ok {
			r.Classes = append(r.Classes, backend.Strength{Class: c, Level: m.Level, Mechanism: Mechanism + ": " + m.Mechanism, Reason: why})
			continue
		}
		r.Classes = append(r.Classes, backend.Strength{Class: c, Level: backend.Unavailable, Mechanism: "none",
			Reason: "the memory backend models no table for this class (the Linux backend wires none either)"})
	}
	if b.cfg.Classes != nil {
		r.Classes = slices.Clone(b.cfg.Classes)
	}
	r.Boundary = []backend.Strength{{Class: "launch", Level: backend.Unavailable, Mechanism: "none",
		Reason: "the memory backend starts no process: Launch returns ErrNotSupported"}}
	return r
}

// Probe reports the model's classes: the network classes at the level the
// model holds them to, every other class unavailable.
func (b *Backend) Probe() backend.Report {
	r := b.report
	r.Classes = slices.Clone(r.Classes)
	r.Boundary = slices.Clone(r.Boundary)
	return r
}

// Launch cannot start a process in a memory session: it returns an error
// wrapping backend.ErrNotSupported (ErrSessionNotFound first, for an
// unknown session, as the Linux backend checks).
func (b *Backend) Launch(name string, cmd *exec.Cmd, opts backend.LaunchOptions) error {
	if _, err := b.Session(name); err != nil {
		return err
	}
	return fmt.Errorf("%w: the memory backend cannot start a process in session %s (it confines nothing on this host)", backend.ErrNotSupported, name)
}

// Close ends the event readers; the tables stay (a new agent may open on
// the same backend, as on a pinned dataplane).
func (b *Backend) Close() error {
	b.events.closeAll()
	return nil
}

// Uninstall removes everything: sessions, handles, rules.
func (b *Backend) Uninstall() error {
	b.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sessions, b.byIndex = map[string]*session{}, map[uint32]*session{}
	b.indices = newIDPool("sessions", b.cfg.MaxSessions)
	b.handles, b.slots = make([]slot, 1), newIDPool("handles", b.cfg.MaxHandles)
	b.neverOKs = map[neverKey]*neverOK{}
	b.nEntries = [4]int{}
	return nil
}

// ---- sessions ----

// session is one session and its address table.
type session struct {
	backend.Session
	limits  backend.Limits
	entries map[netip.Prefix]*entry
	files   []backend.FileEntry    // the files section of the grants applied (files.go)
	process []backend.ProcessEntry // the process section (process.go)
	gated   bool                   // it has held a process entry (process.go)
}

// entry is the rules of one (session, prefix), in order (at most MaxRules).
type entry struct {
	rules []backend.EgressRule
}

// CheckLimits accepts every quota the modelled host has controllers for
// (all, unless Config.RefuseControllers names some) and records it with the
// session; out-of-range values are refused as the Linux backend refuses
// them (ErrInvalidSession).
func (b *Backend) CheckLimits(l backend.Limits) error {
	if l.CPUPercent > 100*1024 {
		return fmt.Errorf("%w: cpu_percent %d", backend.ErrInvalidSession, l.CPUPercent)
	}
	if l.MemoryBytes > math.MaxInt64 || l.Pids > math.MaxInt64 {
		return fmt.Errorf("%w: memory_bytes %d, pids %d: above 2^63-1", backend.ErrInvalidSession, l.MemoryBytes, l.Pids)
	}
	if l.Workspace != nil {
		// The model has no files: the form only.
		if err := l.Workspace.Validate(); err != nil {
			return err
		}
	}
	for _, c := range l.Controllers() {
		if slices.Contains(b.cfg.RefuseControllers, c) {
			return fmt.Errorf("%w: the modelled host has no %s controller", backend.ErrLimitsUnsupported, c)
		}
	}
	return nil
}

// CreateSession makes an empty session with the quotas in l, all or
// nothing: the quotas are checked before anything exists.
func (b *Backend) CreateSession(name string, l backend.Limits) (backend.Session, error) {
	if err := b.CheckLimits(l); err != nil {
		return backend.Session{}, err
	}
	if err := backend.ValidSessionName(name); err != nil {
		return backend.Session{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fault(OpCreateSession); err != nil {
		return backend.Session{}, err
	}
	if _, ok := b.sessions[name]; ok {
		return backend.Session{}, fmt.Errorf("%w: %s", backend.ErrSessionExists, name)
	}
	idx, err := b.indices.take()
	if err != nil {
		return backend.Session{}, err
	}
	b.cgroupIDs++
	s := &session{Session: backend.Session{Name: name, Index: idx, CgroupID: b.cgroupIDs}, limits: l, entries: map[netip.Prefix]*entry{}}
	b.sessions[name] = s
	b.byIndex[idx] = s
	b.counters[idx] = &backend.Denials{}
	return s.Session, nil
}

// DestroySession forgets the session and every entry it held (its
// never-list exceptions too); its index is handed out again. Handles are
// not the session's: they stay.
func (b *Backend) DestroySession(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fault(OpDestroySession); err != nil {
		return err
	}
	s, ok := b.sessions[name]
	if !ok {
		return fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	for k, n := range b.neverOKs {
		if k.session == s.Index {
			for _, h := range n.refs {
				n.unname(h)
			}
			delete(b.neverOKs, k)
		}
	}
	for p := range s.entries {
		b.countEntry(p, -1)
	}
	delete(b.sessions, name)
	delete(b.byIndex, s.Index)
	b.indices.put(s.Index)
	return nil
}

// Session returns the session called name.
func (b *Backend) Session(name string) (backend.Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[name]
	if !ok {
		return backend.Session{}, fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	return s.Session, nil
}

// SessionByIndex returns the session with index idx.
func (b *Backend) SessionByIndex(idx uint32) (backend.Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.byIndex[idx]
	if !ok {
		return backend.Session{}, fmt.Errorf("%w: index %d", backend.ErrSessionNotFound, idx)
	}
	return s.Session, nil
}

// Sessions lists the sessions by index.
func (b *Backend) Sessions() ([]backend.Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessionsLocked(), nil
}

func (b *Backend) sessionsLocked() []backend.Session {
	out := make([]backend.Session, 0, len(b.sessions))
	for _, s := range b.sessions {
		out = append(out, s.Session)
	}
	slices.SortFunc(out, func(x, y backend.Session) int { return int(x.Index) - int(y.Index) })
	return out
}

// SessionLimits returns the quotas a session was created with (the model
// records them; nothing enforces them).
func (b *Backend) SessionLimits(name string) (backend.Limits, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[name]
	if !ok {
		return backend.Limits{}, fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	return s.limits, nil
}

// ---- DNS ----

// SetDNSRedirect records the resolver port (0: off); Connect then lets every
// session's port-53 TCP and UDP use through, as the kernel re-aims it.
func (b *Backend) SetDNSRedirect(port uint16) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dnsPort = port
	return nil
}

// DNSRedirect returns the resolver port (0: off).
func (b *Backend) DNSRedirect() (uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dnsPort, nil
}

// ---- ids ----

// idPool hands out dense ids from 1 up to a limit, reusing returned ones
// first (last returned, first reused), as the Linux backend's pool does.
type idPool struct {
	what  string
	limit uint32
	next  uint32
	free  []uint32
}

func newIDPool(what string, limit uint32) idPool { return idPool{what: what, limit: limit, next: 1} }

func (p *idPool) take() (uint32, error) {
	if n := len(p.free); n > 0 {
		id := p.free[n-1]
		p.free = p.free[:n-1]
		return id, nil
	}
	if p.next >= p.limit {
		return 0, fmt.Errorf("%w: %s (%d)", backend.ErrMapFull, p.what, p.limit)
	}
	p.next++
	return p.next - 1, nil
}

func (p *idPool) put(id uint32) { p.free = append(p.free, id) }

func (p *idPool) inUse() int { return int(p.next) - 1 - len(p.free) }
