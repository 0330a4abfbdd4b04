package agent

// Lifecycle tests on the memory backend (no root, any GOOS): what no host
// enforces is refused; tombstones are pruned. The kernel's once, expiry and
// session-end tests are lifecycle_linux_test.go.

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// TestTLSInspectionRefused: nothing inspects TLS on this host, so neither a
// session nor a grant may ask for it (not enforceable, never a silent flag).
func TestTLSInspectionRefused(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir())
	if err := a.CreateSession(SessionSpec{ID: "tls1", TLSInspection: true}); !errors.Is(err, ErrNotEnforceable) || !strings.Contains(err.Error(), "not enforceable on this host") {
		t.Fatalf("session with tls_inspection: %v", err)
	}
	mustSession(t, a, SessionSpec{ID: "s1"})
	c := loopEgress("127.0.0.2:443")
	c.Egress.TLSInspect = true
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: c, Lifecycle: LifecycleSession}); !errors.Is(err, ErrNotEnforceable) {
		t.Fatalf("grant with tls_inspect: %v", err)
	}
}

// TestTombstonePruning: revoked records are pruned after the retention; the
// pruned grant's token still revokes idempotently and cannot be used.
func TestTombstonePruning(t *testing.T) {
	d := memKernel(t)
	now := time.Now()
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Now = func() time.Time { return now } })
	mustSession(t, a, SessionSpec{ID: "s1"})
	const x = "127.0.0.2:8080"
	g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	now = now.Add(23 * time.Hour)
	a.Sweep(ctx)
	if n := len(a.Grants("")); n != 1 {
		t.Fatalf("pruned too early: %d records", n)
	}
	now = now.Add(2 * time.Hour)
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(a.Grants("")); n != 0 {
		t.Fatalf("not pruned: %d records", n)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatalf("revoke a pruned grant: %v", err)
	}
	if err := a.Consume(ctx, g.Handle); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("use a pruned grant: %v", err)
	}
	if _, err := a.Attenuate(ctx, g.Handle, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("attenuate a pruned grant: %v", err)
	}
}

// TestSweepFindsEveryDue: the sweep looks only at the records its due
// index holds (dueindex.go), so it must act on every record that can become
// due, through each way one enters the index: a session with an expiry, a
// grant with a TTL and its attenuated child (both loaded by a restart), a
// revoke whose teardown failed, a tombstone from before and one from after
// the restart; a grant with none of these is left alone, and once all are
// gone the index holds nothing.
func TestSweepFindsEveryDue(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	m := newMemoryAgentOn(t, memory.MustNew(memory.Config{MaxSessions: 256, MaxHandles: 1024, Now: clock}),
		func(c *Config) { c.Now = clock })
	mustSession(t, m.Agent, SessionSpec{ID: "exp", Image: "py", Expires: now.Add(time.Hour)})
	m.session(t, "keep")
	egress := func(n int) Capability { return loopEgress(fmt.Sprintf("127.0.0.%d:443", n)) }
	ttl := m.grant(t, GrantRequest{Session: "keep", Capability: egress(2), TTL: 30 * time.Minute})
	child, err := m.Attenuate(ctx, ttl.Handle, GrantRequest{Session: "keep", Capability: egress(2), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	before := m.grant(t, GrantRequest{Session: "keep", Capability: egress(3)})
	if err := m.Revoke(ctx, before.Handle); err != nil {
		t.Fatal(err)
	}
	plain := m.grant(t, GrantRequest{Session: "keep", Capability: egress(4)})
	m.reopen(t) // the index is rebuilt from the loaded state

	phases := func() map[string]GrantPhase {
		out := map[string]GrantPhase{}
		for _, g := range m.Grants("") {
			out[g.ID] = g.Phase
		}
		return out
	}
	want := func(step string, w map[string]GrantPhase) {
		t.Helper()
		if got := phases(); !maps.Equal(got, w) {
			t.Fatalf("%s: grants %v, want %v", step, got, w)
		}
	}
	mustSession(t, m.Agent, SessionSpec{ID: "exp2", Image: "py", Expires: now.Add(time.Hour)})
	ttl2 := m.grant(t, GrantRequest{Session: "keep", Capability: egress(6), TTL: 30 * time.Minute})
	retry := m.grant(t, GrantRequest{Session: "keep", Capability: egress(5)})
	m.b.FailNext(memory.OpRelease, 1, errors.New("input/output error"))
	if err := m.Revoke(ctx, retry.Handle); err == nil {
		t.Fatal("revoke with a failing release: no error")
	}
	m.b.FailNext(memory.OpApply, 1, errors.New("no space left on device"))
	if _, err := m.Grant(ctx, GrantRequest{Session: "keep", Capability: egress(7), Lifecycle: LifecycleSession}); err == nil {
		t.Fatal("grant with a failing apply: no error")
	}
	rolled := ""
	for id, p := range phases() {
		if p == PhaseRolledBack {
			rolled = id
		}
	}
	want("the failed teardown", map[string]GrantPhase{ttl.ID: PhaseLive, child.ID: PhaseLive, ttl2.ID: PhaseLive, before.ID: PhaseRevoked, rolled: PhaseRolledBack, plain.ID: PhaseLive, retry.ID: PhaseRevoking})
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	want("retried", map[string]GrantPhase{ttl.ID: PhaseLive, child.ID: PhaseLive, ttl2.ID: PhaseLive, before.ID: PhaseRevoked, rolled: PhaseRolledBack, plain.ID: PhaseLive, retry.ID: PhaseRevoked})

	now = now.Add(31 * time.Minute)
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	want("the TTL passed", map[string]GrantPhase{ttl.ID: PhaseRevoked, child.ID: PhaseRevoked, ttl2.ID: PhaseRevoked, before.ID: PhaseRevoked, rolled: PhaseRolledBack, plain.ID: PhaseLive, retry.ID: PhaseRevoked})
	for _, id := range []string{"exp", "exp2"} {
		if _, ok := m.Session(id); !ok {
			t.Fatalf("session %s ended before its expiry", id)
		}
	}
	now = now.Add(30 * time.Minute)
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"exp", "exp2"} {
		if _, ok := m.Session(id); ok {
			t.Fatalf("session %s not ended at its expiry", id)
		}
	}
	now = now.Add(25 * time.Hour)
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	want("the tombstones' retention passed", map[string]GrantPhase{plain.ID: PhaseLive})
	if _, ok := m.Session("keep"); !ok {
		t.Fatal("session keep ended")
	}
	m.mu.Lock()
	n, s := len(m.due.grants), len(m.due.sessions)
	m.unlock()
	if n != 0 || s != 0 {
		t.Fatalf("due index keeps %d grants and %d sessions, want none", n, s)
	}
}
