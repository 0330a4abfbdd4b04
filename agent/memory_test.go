package agent

// The agent's grant, revoke, membrane and reconcile tests on the memory
// backend (agent/backend/memory): no root, no BPF kernel, any GOOS. A use
// the kernel tests make with a real connect from a probe process is asked
// of the memory backend's Connect, which decides as the kernel hooks do.
// The kernel-facing versions stay in *_linux_test.go.

import (
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// memClock is a clock tests move by hand, shared by agent and backend.
type memClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *memClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *memClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// memoryAgent is an agent on a memory backend, with what reopening it
// needs (a new agent on the same state directory and backend, as after a
// restart).
type memoryAgent struct {
	*Agent
	b      *memory.Backend
	dir    string
	events *eventLog
	mods   []func(*Config)
}

// newMemoryAgent opens an agent on a fresh memory backend and a fresh state
// directory; mods adjust its Config (and every reopened agent's).
func newMemoryAgent(t testing.TB, mods ...func(*Config)) *memoryAgent {
	t.Helper()
	return newMemoryAgentOn(t, memKernel(t), mods...)
}

func newMemoryAgentOn(t testing.TB, b *memory.Backend, mods ...func(*Config)) *memoryAgent {
	t.Helper()
	m := &memoryAgent{b: b, dir: t.TempDir(), mods: mods}
	m.reopen(t)
	return m
}

// reopen closes the agent and opens a new one on the same state directory
// and backend, as a restart does.
func (m *memoryAgent) reopen(t testing.TB) {
	t.Helper()
	if m.Agent != nil {
		if err := m.Agent.Close(); err != nil {
			t.Fatalf("close agent: %v", err)
		}
		m.Agent = nil
	}
	a, err := m.open(t)
	if err != nil {
		t.Fatalf("open agent: %v", err)
	}
	m.Agent = a
	t.Cleanup(func() { a.Close() })
}

func (m *memoryAgent) open(t testing.TB) (*Agent, error) {
	t.Helper()
	m.events = &eventLog{}
	cfg := Config{StateDir: m.dir, Kernel: m.b, Manifests: testManifests(t), Logger: quiet, Events: m.events}
	for _, f := range m.mods {
		f(&cfg)
	}
	return Open(cfg)
}

func (m *memoryAgent) session(t testing.TB, id string) {
	t.Helper()
	mustSession(t, m.Agent, SessionSpec{ID: id, Image: "py"})
}

func (m *memoryAgent) grant(t testing.TB, req GrantRequest) *Grant {
	t.Helper()
	if req.Lifecycle == "" {
		req.Lifecycle = LifecycleSession
	}
	g, err := m.Grant(ctx, req)
	if err != nil {
		t.Fatalf("grant %v to %s: %v", req.Capability, req.Session, err)
	}
	return g
}

// The uses and the backend's state, as in setup_test.go, on m's backend.
func (m *memoryAgent) wantUse(t testing.TB, session, dst string, want backend.Reason) {
	t.Helper()
	wantUse(t, m.b, session, dst, want)
}

func (m *memoryAgent) wantAllowed(t testing.TB, session string, dsts ...string) {
	t.Helper()
	wantAllowed(t, m.b, session, dsts...)
}

func (m *memoryAgent) wantDenied(t testing.TB, session string, dsts ...string) {
	t.Helper()
	wantDenied(t, m.b, session, dsts...)
}

func (m *memoryAgent) liveHandles(t testing.TB) []backend.Handle {
	t.Helper()
	return liveHandles(t, m.b)
}

func (m *memoryAgent) rules(t testing.TB, session string) []backend.EgressRule {
	t.Helper()
	return kernelRules(t, m.b, session)
}

// info returns the grant's view by id.
func (m *memoryAgent) info(t testing.TB, id string) GrantInfo {
	t.Helper()
	for _, g := range m.Grants("") {
		if g.ID == id {
			return g
		}
	}
	t.Fatalf("no grant %s", id)
	return GrantInfo{}
}

// memPrefixCap is a net.egress capability for a prefix, every port.
func memPrefixCap(p string) Capability {
	return Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix(p)}}}
}

// TestMemoryGrantRevoke: a grant opens exactly its destination; revoke
// closes it at the next use, is idempotent, and leaves no handle or rule;
// a revoked token replays to ErrHandleRevoked, a forged one is refused.
func TestMemoryGrantRevoke(t *testing.T) {
	m := newMemoryAgent(t)
	m.session(t, "s1")
	const x, other = "127.0.0.2:8080", "127.0.0.3:8080"
	m.wantUse(t, "s1", x, backend.ReasonNoRule)
	g := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(x)})
	if g.Tier != TierAuto {
		t.Fatalf("loopback egress tier = %s", g.Tier)
	}
	m.wantAllowed(t, "s1", x)
	m.wantUse(t, "s1", other, backend.ReasonNoRule)
	ap := netip.MustParseAddrPort(x)
	use := UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()}
	if dec, err := m.Decide("s1", use); err != nil || !dec.Allowed {
		t.Fatalf("Decide after grant: %+v %v", dec, err)
	}
	if n, r := len(m.liveHandles(t)), len(m.rules(t, "s1")); n != 1 || r != 1 {
		t.Fatalf("%d live handles and %d rules, want 1 and 1", n, r)
	}
	if err := m.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	m.wantUse(t, "s1", x, backend.ReasonNoRule) // the rule went with the grant
	if dec, _ := m.Decide("s1", use); dec.Allowed {
		t.Fatal("Decide after revoke allows")
	}
	if n, r := len(m.liveHandles(t)), len(m.rules(t, "s1")); n != 0 || r != 0 {
		t.Fatalf("%d live handles and %d rules after revoke", n, r)
	}
	if err := m.Revoke(ctx, g.Handle); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
	if err := m.Consume(ctx, g.Handle); !errors.Is(err, ErrHandleRevoked) {
		t.Fatalf("replayed handle Consume: %v", err)
	}
	if _, err := m.Attenuate(ctx, g.Handle, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrHandleRevoked) {
		t.Fatalf("attenuate a revoked handle: %v", err)
	}
	forged := g.Handle[:len(g.Handle)-2] + "aa"
	if forged == g.Handle {
		forged = g.Handle[:len(g.Handle)-2] + "bb"
	}
	if err := m.Revoke(ctx, forged); !errors.Is(err, ErrForgedHandle) {
		t.Fatalf("forged revoke: %v", err)
	}
	for _, k := range []string{"session.create", "grant.issue", "grant.revoke"} {
		if !m.events.has(k) {
			t.Errorf("no %s event", k)
		}
	}
}

// TestMemoryMembrane: a child grant for a sub-agent session is narrower
// than its parent; widening is refused and changes nothing; a once child
// has no session-long grandchild; revoking the parent kills children and
// grandchildren at their next use. The kernel's is TestAttenuationMembrane.
func TestMemoryMembrane(t *testing.T) {
	m := newMemoryAgent(t, func(c *Config) { c.Breaker = BreakerConfig{Consecutive: 100, Total: 100} })
	m.session(t, "parent")
	m.session(t, "child")
	const x, y = "127.0.0.2:8080", "127.0.0.5:8080"
	pg := m.grant(t, GrantRequest{Session: "parent", Capability: memPrefixCap("127.0.0.0/29")})
	before := len(m.liveHandles(t))
	for _, tc := range []struct {
		name string
		c    Capability
		lc   Lifecycle
		want error
	}{
		{"wider prefix", memPrefixCap("127.0.0.0/28"), LifecycleSession, ErrWidens},
		{"other prefix", loopEgress("127.0.0.9:80"), LifecycleSession, ErrWidens},
		{"add a domain", Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"a.example.com"}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}, LifecycleSession, ErrWidens},
		{"class change", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, LifecycleSession, ErrWidens},
		{"standing outlives", loopEgress(x), LifecycleStanding, ErrStandingInSession},
	} {
		_, err := m.Attenuate(ctx, pg.Handle, GrantRequest{Session: "child", Capability: tc.c, Lifecycle: tc.lc})
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if n := len(m.liveHandles(t)); n != before {
			t.Fatalf("%s: a refused attenuation changed the backend: %d live handles, want %d", tc.name, n, before)
		}
	}
	cg, err := m.Attenuate(ctx, pg.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	gg, err := m.Attenuate(ctx, cg.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	if ggi := m.info(t, gg.ID); ggi.Parent != cg.ID {
		t.Fatalf("grandchild's parent %s, want %s", ggi.Parent, cg.ID)
	}
	// An approve-once child may have a once grandchild, never a session-long one.
	oc, err := m.Attenuate(ctx, pg.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleOnce, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attenuate(ctx, oc.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleOnce}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attenuate(ctx, oc.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrWidens) {
		t.Fatalf("session grandchild of a once grant: %v", err)
	}
	m.wantAllowed(t, "child", x)
	m.wantUse(t, "child", y, backend.ReasonNoRule)
	m.wantAllowed(t, "parent", y)
	if err := m.Revoke(ctx, pg.Handle); err != nil {
		t.Fatal(err)
	}
	m.wantDenied(t, "child", x)
	m.wantDenied(t, "parent", y)
	for _, gi := range m.Grants("") {
		if gi.Phase != PhaseRevoked {
			t.Fatalf("grant %s is %s after the membrane revoke", gi.ID[:8], gi.Phase)
		}
	}
	if err := m.Revoke(ctx, gg.Handle); err != nil {
		t.Fatalf("revoking a dead descendant: %v", err)
	}
	if n := len(m.liveHandles(t)); n != 0 {
		t.Fatalf("live handles left: %d", n)
	}
}

// TestMemoryRevokeIsOneWrite: revoking a leaf is one handle-state write and
// one sweep; revoking a parent with five descendants is still one write and
// one sweep, and reclaims every rule and slot.
func TestMemoryRevokeIsOneWrite(t *testing.T) {
	m := newMemoryAgent(t)
	m.session(t, "s1")
	dsts := []string{"127.0.0.2:8080", "127.0.0.3:8080", "127.0.0.4:8080"}
	revoke := func(t *testing.T, token string) backend.Ops {
		t.Helper()
		before := m.b.Ops()
		if err := m.Revoke(ctx, token); err != nil {
			t.Fatal(err)
		}
		after := m.b.Ops()
		return backend.Ops{RevokeWrites: after.RevokeWrites - before.RevokeWrites, Sweeps: after.Sweeps - before.Sweeps}
	}
	t.Run("leaf", func(t *testing.T) {
		g := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(dsts[0])})
		m.wantAllowed(t, "s1", dsts[0])
		if ops := revoke(t, g.Handle); ops.RevokeWrites != 1 || ops.Sweeps != 1 {
			t.Fatalf("leaf revoke cost %+v, want one write and one sweep", ops)
		}
		m.wantDenied(t, "s1", dsts[0])
		if ops := revoke(t, g.Handle); ops != (backend.Ops{}) {
			t.Fatalf("second revoke cost %+v, want nothing", ops)
		}
	})
	t.Run("parent with descendants", func(t *testing.T) {
		pg := m.grant(t, GrantRequest{Session: "s1", Capability: memPrefixCap("127.0.0.0/29")})
		var tokens []string
		for _, d := range dsts {
			c, err := m.Attenuate(ctx, pg.Handle, GrantRequest{Session: "s1", Capability: loopEgress(d), Lifecycle: LifecycleSession})
			if err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, c.Handle)
		}
		gc, err := m.Attenuate(ctx, tokens[0], GrantRequest{Session: "s1", Capability: loopEgress(dsts[0]), Lifecycle: LifecycleSession})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Attenuate(ctx, gc.Handle, GrantRequest{Session: "s1", Capability: loopEgress(dsts[0]), Lifecycle: LifecycleSession}); err != nil {
			t.Fatal(err)
		}
		if n := len(m.liveHandles(t)); n != 6 {
			t.Fatalf("%d live handles before the revoke, want 6", n)
		}
		m.wantAllowed(t, "s1", dsts...)
		if ops := revoke(t, pg.Handle); ops.RevokeWrites != 1 || ops.Sweeps != 1 {
			t.Fatalf("parent revoke cost %+v, want one write and one sweep", ops)
		}
		m.wantDenied(t, "s1", dsts...)
		snap, err := m.b.Snapshot()
		if err != nil || len(snap.Handles) != 0 || len(snap.Deltas) != 0 {
			t.Fatalf("left after the revoke: handles %v, rules %v (%v)", snap.Handles, snap.Deltas, err)
		}
		for _, g := range m.Grants("s1") {
			if g.Phase != PhaseRevoked {
				t.Fatalf("grant %s is %s after the revoke", g.ID, g.Phase)
			}
		}
	})
}
