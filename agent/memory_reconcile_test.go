package agent

// Reconcile, rollback, approve-once and lifecycle tests on the memory
// backend (see memory_test.go).

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// memRepaired counts what a reconcile report repaired.
func memRepaired(rep *ReconcileReport) int {
	return len(rep.RolledBack) + len(rep.Revoked) + len(rep.OrphanHandles) + rep.OrphanRules + len(rep.OrphanSessions) + len(rep.EndedSessions)
}

// TestMemoryReconcileDrift: state survives a restart; reconcile repairs
// drift in the fail-closed direction: a live grant whose handle was revoked
// or whose rule vanished behind the agent's back is revoked (never
// re-applied); an orphan handle, an orphan rule and an orphan session are
// removed; a session gone from the backend ends.
func TestMemoryReconcileDrift(t *testing.T) {
	m := newMemoryAgent(t)
	m.session(t, "s1")
	const x, y, z, w = "127.0.0.2:8080", "127.0.0.3:8080", "127.0.0.4:8080", "127.0.0.6:8080"
	gx := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(x)})
	gy := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(y)})
	gz := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(z)})
	m.reopen(t)
	m.wantAllowed(t, "s1", x, y, z)
	// Drift: y's handle revoked behind the agent's back, z's rule removed,
	// an orphan handle with an orphan rule, an orphan session.
	if err := m.b.Revoke(m.info(t, gy.ID).Kernel); err != nil {
		t.Fatal(err)
	}
	zk := m.info(t, gz.ID).Kernel
	for _, r := range m.rules(t, "s1") {
		if r.Handle == zk {
			if err := m.b.Release("s1", backend.HandleRef{}, backend.DeltaOf([]backend.EgressRule{r})); err != nil {
				t.Fatal(err)
			}
		}
	}
	orphan, err := m.b.NewHandle(backend.HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.b.AllowEgress("s1", backend.EgressRule{Prefix: netip.MustParsePrefix("127.0.0.6/32"), Ports: backend.Port(8080), Handle: orphan}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.b.CreateSession("ghost", backend.Limits{}); err != nil {
		t.Fatal(err)
	}
	m.wantAllowed(t, "s1", w)

	m.reopen(t)
	for id, want := range map[string]GrantPhase{gx.ID: PhaseLive, gy.ID: PhaseRevoked, gz.ID: PhaseRevoked} {
		if got := m.info(t, id).Phase; got != want {
			t.Fatalf("grant %s is %s after reconcile, want %s", id[:8], got, want)
		}
	}
	m.wantAllowed(t, "s1", x)
	m.wantDenied(t, "s1", y, z, w)
	if n := len(m.liveHandles(t)); n != 1 {
		t.Fatalf("live handles after reconcile = %d, want 1", n)
	}
	if rs := m.rules(t, "s1"); len(rs) != 1 || rs[0].Handle != m.info(t, gx.ID).Kernel {
		t.Fatalf("rules after reconcile: %v", rs)
	}
	if _, err := m.b.Session("ghost"); !errors.Is(err, backend.ErrSessionNotFound) {
		t.Fatalf("orphan session survived reconcile: %v", err)
	}
	if rep, err := m.Reconcile(); err != nil || memRepaired(rep) != 0 {
		t.Fatalf("a second reconcile repaired %+v (%v)", rep, err)
	}
	// The session vanishing from the backend ends it in the state.
	if err := m.b.DestroySession("s1"); err != nil {
		t.Fatal(err)
	}
	m.reopen(t)
	if len(m.Sessions()) != 0 || len(m.liveHandles(t)) != 0 {
		t.Fatalf("sessions %v, live handles %d after the backend session vanished", m.Sessions(), len(m.liveHandles(t)))
	}
}

// TestMemoryKernelFailureRollsBack: a backend step failing in the middle
// of GRANT (a fifth rule on one prefix, a chain too deep, an injected
// failure of NewHandle or Apply) rolls the whole grant back: no live
// handle, no rule, a rolled-back tombstone, nothing reachable; the same
// grant succeeds once the backend recovers.
func TestMemoryKernelFailureRollsBack(t *testing.T) {
	m := newMemoryAgent(t)
	m.session(t, "s1")
	const x = "127.0.0.2:8080"
	rolledBack := func(t *testing.T, n int) {
		t.Helper()
		if h := len(m.liveHandles(t)); h != 0 {
			t.Fatalf("live handles after rollback: %d", h)
		}
		if rs := m.rules(t, "s1"); len(rs) != 0 {
			t.Fatalf("rules after rollback: %v", rs)
		}
		gs := m.Grants("s1")
		if len(gs) != n || gs[n-1].Phase != PhaseRolledBack {
			t.Fatalf("grants after rollback: %+v", gs)
		}
		if !m.events.has("grant.rollback") {
			t.Fatal("no rollback event")
		}
		m.wantDenied(t, "s1", x)
	}
	five := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Ports: []PortRange{{Lo: 8080, Hi: 8080}, {Lo: 1001, Hi: 1001}, {Lo: 1002, Hi: 1002}, {Lo: 1003, Hi: 1003}, {Lo: 1004, Hi: 1004}}}}
	_, err := m.Grant(ctx, GrantRequest{Session: "s1", Capability: five, Lifecycle: LifecycleSession})
	if !errors.Is(err, ErrKernel) || !errors.Is(err, backend.ErrRulesFull) {
		t.Fatalf("err = %v, want ErrKernel wrapping ErrRulesFull", err)
	}
	rolledBack(t, 1)

	enospc := errors.New("no space left on device")
	for i, op := range []memory.Op{memory.OpNewHandle, memory.OpApply} {
		m.b.FailNext(op, 1, enospc)
		_, err := m.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
		if !errors.Is(err, ErrKernel) || !errors.Is(err, enospc) {
			t.Fatalf("%s failing: err = %v, want ErrKernel wrapping the injected error", op, err)
		}
		rolledBack(t, i+2)
	}
	g := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(x)})
	m.wantAllowed(t, "s1", x)

	// A revoke whose backend write fails reports it; the grant is not
	// reachable afterwards, and a retry (or the next start) finishes.
	m.b.FailNext(memory.OpRevoke, 1, enospc)
	if err := m.Revoke(ctx, g.Handle); !errors.Is(err, enospc) {
		t.Fatalf("revoke with a failing backend write: %v", err)
	}
	m.wantDenied(t, "s1", x)
	if err := m.Revoke(ctx, g.Handle); err != nil {
		t.Fatalf("revoke again: %v", err)
	}
	m.reopen(t)
	if n := len(m.liveHandles(t)); n != 0 {
		t.Fatalf("live handles after the restart: %d", n)
	}

	// A delegation chain deeper than the backend walks (domain-only
	// grants: handles and no rules).
	dom := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"**.example.com"}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
	_, err = m.Grant(ctx, GrantRequest{Session: "s1", Capability: dom, Lifecycle: LifecycleSession})
	var are *ApprovalRequiredError
	if !errors.As(err, &are) {
		t.Fatalf("domain egress should ask: %v", err)
	}
	root, err := m.Approve(ctx, are.ID, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if doms := m.EgressDomains("s1"); len(doms["**.example.com"]) != 1 {
		t.Fatalf("EgressDomains = %v", doms)
	}
	tok := root.Handle
	var chainErr error
	for i := 0; i < memory.MaxChain+1 && chainErr == nil; i++ {
		var cg *Grant
		if cg, chainErr = m.Attenuate(ctx, tok, GrantRequest{Session: "s1", Capability: dom, Lifecycle: LifecycleSession}); chainErr == nil {
			tok = cg.Handle
		}
	}
	if !errors.Is(chainErr, backend.ErrChainTooDeep) {
		t.Fatalf("deep chain: %v", chainErr)
	}
	if n := len(m.liveHandles(t)); n != memory.MaxChain {
		t.Fatalf("live handles = %d, want %d (the failed link rolled back)", n, memory.MaxChain)
	}
	if err := m.Revoke(ctx, root.Handle); err != nil {
		t.Fatal(err)
	}
	if n := len(m.liveHandles(t)); n != 0 {
		t.Fatalf("live handles after revoking the root of the chain: %d", n)
	}
}

// TestMemoryOnceAndExpiry: an approve-once grant is consumed by its first
// use in the backend (no Consume call), after which the use-time decision
// denies it as consumed; a TTL grant is denied once its deadline passes
// and swept by the agent. The clock is the test's, shared by agent and
// backend. The kernel's are TestOnceAndExpiry, TestOnceInKernel and
// TestOnceDecideConsumed.
func TestMemoryOnceAndExpiry(t *testing.T) {
	clk := &memClock{t: time.Now()}
	b := memory.MustNew(memory.Config{Now: clk.Now})
	m := newMemoryAgentOn(t, b, func(c *Config) { c.Now = clk.Now })
	m.session(t, "s1")
	const x, y, z = "127.0.0.2:8080", "127.0.0.3:8080", "127.0.0.4:8080"
	once := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleOnce})
	if once.Expires.IsZero() || once.Expires.After(clk.Now().Add(DefaultOnceTTL+time.Second)) {
		t.Fatalf("once grant expiry %v", once.Expires)
	}
	short := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(y), TTL: 1500 * time.Millisecond})
	// z: an approve-once grant and a session grant both cover it.
	m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(z), Lifecycle: LifecycleOnce})
	m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(z)})
	use := func(hp string) UseRequest {
		ap := netip.MustParseAddrPort(hp)
		return UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()}
	}
	consumed := func() (n int) {
		for _, g := range m.Grants("s1") {
			if g.Consumed {
				n++
			}
		}
		return n
	}
	if ud, err := m.DecideUse("s1", use(x)); err != nil || !ud.Allowed {
		t.Fatalf("before the first use: %+v, %v", ud, err)
	}
	if n := consumed(); n != 0 {
		t.Fatalf("before any use: %d grants listed consumed", n)
	}
	m.wantAllowed(t, "s1", x)
	if st := m.info(t, once.ID); !st.Consumed {
		t.Fatalf("the once grant is not listed consumed after its use: %+v", st)
	}
	if n := consumed(); n != 1 {
		t.Fatalf("after the first use: %d grants listed consumed, want 1", n)
	}
	m.wantUse(t, "s1", x, backend.ReasonHandleRevoked)
	if ud, err := m.DecideUse("s1", use(x)); err != nil || ud.Allowed || ud.DecidedBy != ConsumedOnce {
		t.Fatalf("after the backend consumed it: %+v, %v; want denied by %q", ud, err, ConsumedOnce)
	}
	if ud, err := m.DecideUse("s1", use(z)); err != nil || !ud.Allowed {
		t.Fatalf("a destination a session grant covers too: %+v, %v", ud, err)
	}
	// Reporting the use afterwards is still accepted (it revokes the grant).
	if err := m.Consume(ctx, once.Handle); err != nil {
		t.Fatal(err)
	}
	m.wantAllowed(t, "s1", y)
	clk.add(1600 * time.Millisecond)
	m.wantUse(t, "s1", y, backend.ReasonHandleExpired)
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Consume(ctx, short.Handle); !errors.Is(err, ErrHandleRevoked) {
		t.Fatalf("expired handle: %v", err)
	}
	for _, h := range m.liveHandles(t) {
		if h.Ref == m.info(t, short.ID).Kernel {
			t.Fatalf("the expired grant's handle is still %s after the sweep", h.State)
		}
	}
}

// TestMemoryEndSession: ending a session revokes its grants, those
// attenuated from them in other sessions included, and destroys it in the
// backend.
func TestMemoryEndSession(t *testing.T) {
	m := newMemoryAgent(t)
	m.session(t, "s1")
	m.session(t, "sub")
	const x = "127.0.0.2:8080"
	g := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(x)})
	if _, err := m.Attenuate(ctx, g.Handle, GrantRequest{Session: "sub", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	m.wantAllowed(t, "sub", x)
	if err := m.EndSession("s1"); err != nil {
		t.Fatal(err)
	}
	m.wantDenied(t, "sub", x)
	if _, err := m.b.Session("s1"); !errors.Is(err, backend.ErrSessionNotFound) {
		t.Fatalf("the ended session is still in the backend: %v", err)
	}
	if err := m.EndSession("s1"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("end twice: %v", err)
	}
	if err := m.CreateSession(SessionSpec{ID: "../x", Image: "py"}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("bad session id: %v", err)
	}
	if err := m.CreateSession(SessionSpec{ID: "sub", Image: "py"}); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("duplicate session: %v", err)
	}
	if n := len(m.liveHandles(t)); n != 0 {
		t.Fatalf("live handles after the session ended: %d", n)
	}
}
