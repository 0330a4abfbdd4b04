package agent

// The agent against the real dataplane, end to end, as root: real connects
// from a probe process in the session's cgroup. Their memory twins, which
// run without root, are memory_test.go and memory_reconcile_test.go.

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
)

// TestGrantRevokeEndToEnd: a grant opens exactly its destination in the
// kernel; revoke closes it at the next connect; revoke is idempotent; a
// revoked handle replays to ErrHandleRevoked; a forged one is refused.
// Memory twin: TestMemoryGrantRevoke.
func TestGrantRevokeEndToEnd(t *testing.T) {
	d, _ := newKernel(t)
	events := &eventLog{}
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Events = events })
	mustSession(t, a, SessionSpec{ID: "s1", Workspace: "/work", Home: "/home/agent"})
	allowed := listenTCP(t, "127.0.0.2:0")
	other := listenTCP(t, "127.0.0.3:0")
	p := startProbe(t, d, "s1")
	if got := p.DoAsync("tcp " + allowed); got != "err EPERM" {
		t.Fatalf("before grant: %s", got)
	}
	g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(allowed), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	if g.Tier != TierAuto {
		t.Fatalf("loopback egress tier = %s", g.Tier)
	}
	if got := p.DoAsync("tcp " + allowed); got != "ok" {
		t.Fatalf("after grant: %s", got)
	}
	if got := p.DoAsync("tcp " + other); got != "err EPERM" {
		t.Fatalf("other destination after grant: %s", got)
	}
	ap := netip.MustParseAddrPort(allowed)
	use := UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()}
	if dec, err := a.Decide("s1", use); err != nil || !dec.Allowed {
		t.Fatalf("Decide after grant: %+v %v", dec, err)
	}
	if n := len(liveHandles(t, d)); n != 1 {
		t.Fatalf("live handles = %d", n)
	}
	if n := len(kernelRules(t, d, "s1")); n != 1 {
		t.Fatalf("rules = %d", n)
	}

	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + allowed); got != "err EPERM" {
		t.Fatalf("after revoke: %s", got)
	}
	if dec, _ := a.Decide("s1", use); dec.Allowed {
		t.Fatal("Decide after revoke allows")
	}
	if n := len(liveHandles(t, d)); n != 0 {
		t.Fatalf("live handles after revoke = %d", n)
	}
	if n := len(kernelRules(t, d, "s1")); n != 0 {
		t.Fatalf("rules after revoke = %d", n)
	}
	// Idempotent revoke; replayed and forged handles.
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
	if err := a.Consume(ctx, g.Handle); !errors.Is(err, ErrHandleRevoked) {
		t.Fatalf("replayed handle Consume: %v", err)
	}
	if _, err := a.Attenuate(ctx, g.Handle, GrantRequest{Session: "s1", Capability: loopEgress(allowed), Lifecycle: LifecycleSession}); !errors.Is(err, ErrHandleRevoked) {
		t.Fatalf("attenuate a revoked handle: %v", err)
	}
	forged := g.Handle[:len(g.Handle)-2] + "aa"
	if forged == g.Handle {
		forged = g.Handle[:len(g.Handle)-2] + "bb"
	}
	if err := a.Revoke(ctx, forged); !errors.Is(err, ErrForgedHandle) {
		t.Fatalf("forged revoke: %v", err)
	}
	want := []string{"session.create", "grant.issue", "grant.revoke"}
	for _, k := range want {
		if !slices.Contains(events.kinds(), k) {
			t.Errorf("no %s event in %v", k, events.kinds())
		}
	}
}

// TestAttenuationMembrane: a child grant for a sub-agent session is narrower
// than its parent; widening is refused (and changes nothing); revoking the
// parent kills the child in the kernel at once. Memory twin:
// TestMemoryMembrane.
func TestAttenuationMembrane(t *testing.T) {
	d, _ := newKernel(t)
	// The widening attempts below are denials; keep the breaker out of the way.
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Breaker = BreakerConfig{Consecutive: 100, Total: 100} })
	mustSession(t, a, SessionSpec{ID: "parent"})
	mustSession(t, a, SessionSpec{ID: "child"})
	x := listenTCP(t, "127.0.0.2:0")
	y := listenTCP(t, "127.0.0.5:0")
	parentCap := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/29")}}}
	pg, err := a.Grant(ctx, GrantRequest{Session: "parent", Capability: parentCap, Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	handlesBefore := len(liveHandles(t, d))
	widen := []struct {
		name string
		c    Capability
		lc   Lifecycle
		want error
	}{
		{"wider prefix", Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/28")}}}, LifecycleSession, ErrWidens},
		{"other prefix", loopEgress("127.0.0.9:80"), LifecycleSession, ErrWidens},
		{"add a domain", Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"a.example.com"}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}, LifecycleSession, ErrWidens},
		{"class change", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, LifecycleSession, ErrWidens},
		{"standing outlives", loopEgress(x), LifecycleStanding, ErrStandingInSession},
	}
	for _, tc := range widen {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Attenuate(ctx, pg.Handle, GrantRequest{Session: "child", Capability: tc.c, Lifecycle: tc.lc})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if n := len(liveHandles(t, d)); n != handlesBefore {
				t.Fatalf("a refused attenuation changed the kernel: %d live handles, want %d", n, handlesBefore)
			}
		})
	}
	cg, err := a.Attenuate(ctx, pg.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleOnce, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Grandchild, to check the membrane is transitive.
	gg, err := a.Attenuate(ctx, cg.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleOnce})
	if err != nil {
		t.Fatal(err)
	}
	// A once child cannot have a session-long grandchild.
	if _, err := a.Attenuate(ctx, cg.Handle, GrantRequest{Session: "child", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrWidens) {
		t.Fatalf("session grandchild of a once grant: %v", err)
	}
	pc := startProbe(t, d, "child")
	pp := startProbe(t, d, "parent")
	if got := pc.DoAsync("tcp " + x); got != "ok" {
		t.Fatalf("child before revoke: %s", got)
	}
	if got := pc.DoAsync("tcp " + y); got != "err EPERM" {
		t.Fatalf("child outside its attenuation: %s", got)
	}
	if got := pp.DoAsync("tcp " + y); got != "ok" {
		t.Fatalf("parent inside its /29: %s", got)
	}
	if err := a.Revoke(ctx, pg.Handle); err != nil {
		t.Fatal(err)
	}
	if got := pc.DoAsync("tcp " + x); got != "err EPERM" {
		t.Fatalf("child after parent revoke: %s", got)
	}
	if got := pp.DoAsync("tcp " + y); got != "err EPERM" {
		t.Fatalf("parent after revoke: %s", got)
	}
	for _, gi := range a.Grants("") {
		if gi.Phase != PhaseRevoked {
			t.Fatalf("grant %s is %s after the membrane revoke", gi.ID[:8], gi.Phase)
		}
	}
	if err := a.Revoke(ctx, gg.Handle); err != nil {
		t.Fatalf("revoking a dead descendant: %v", err)
	}
	if n := len(liveHandles(t, d)); n != 0 {
		t.Fatalf("live handles left: %d", n)
	}
}

// TestRestartAndDrift: state survives a restart; reconcile repairs drift in
// the fail-closed direction. Memory twin: TestMemoryReconcileDrift.
func TestRestartAndDrift(t *testing.T) {
	d, _ := newKernel(t)
	dir := t.TempDir()
	a := openAgent(t, d, dir)
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	y := listenTCP(t, "127.0.0.3:0")
	z := listenTCP(t, "127.0.0.4:0")
	gx, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	gy, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(y), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	gz, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(z), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	// Plain restart: everything still live and the token still works.
	a = openAgent(t, d, dir)
	p := startProbe(t, d, "s1")
	for _, dst := range []string{x, y, z} {
		if got := p.DoAsync("tcp " + dst); got != "ok" {
			t.Fatalf("after restart %s: %s", dst, got)
		}
	}
	// Drift: y's handle revoked behind the agent's back; z's rule removed;
	// an orphan handle and an orphan rule added.
	info := map[string]GrantInfo{}
	for _, gi := range a.Grants("s1") {
		info[gi.ID] = gi
	}
	idOf := func(tok string) string { id, _ := a.minter.verify(tok); return id }
	if err := d.Revoke(info[idOf(gy.Handle)].Kernel); err != nil {
		t.Fatal(err)
	}
	zr := kernelRules(t, d, "s1")
	for _, r := range zr {
		if r.Handle == info[idOf(gz.Handle)].Kernel {
			if err := d.RemoveEgress("s1", r); err != nil {
				t.Fatal(err)
			}
		}
	}
	orphan, err := d.NewHandle(dataplane.HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	w := listenTCP(t, "127.0.0.6:0")
	wr := dataplane.EgressRule{Prefix: netip.MustParsePrefix("127.0.0.6/32"), Ports: dataplane.Port(netip.MustParseAddrPort(w).Port()), Handle: orphan}
	if err := d.AllowEgress("s1", wr); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + w); got != "ok" {
		t.Fatalf("orphan rule not in force before reconcile: %s", got)
	}
	a = openAgent(t, d, dir)
	phase := map[string]GrantPhase{}
	for _, gi := range a.Grants("s1") {
		phase[gi.ID] = gi.Phase
	}
	if phase[idOf(gx.Handle)] != PhaseLive || phase[idOf(gy.Handle)] != PhaseRevoked || phase[idOf(gz.Handle)] != PhaseRevoked {
		t.Fatalf("phases after drift: %v", phase)
	}
	want := map[string]string{x: "ok", y: "err EPERM", z: "err EPERM", w: "err EPERM"}
	for dst, res := range want {
		if got := p.DoAsync("tcp " + dst); got != res {
			t.Errorf("after reconcile %s: %s, want %s", dst, got, res)
		}
	}
	if n := len(liveHandles(t, d)); n != 1 {
		t.Fatalf("live handles after reconcile = %d, want 1", n)
	}
	// The session's cgroup disappearing ends the session in the state.
	if err := d.DestroySession("s1"); err != nil {
		t.Fatal(err)
	}
	a = openAgent(t, d, dir)
	if len(a.Sessions()) != 0 || len(liveHandles(t, d)) != 0 {
		t.Fatalf("sessions %v, live handles %d after the kernel session vanished", a.Sessions(), len(liveHandles(t, d)))
	}
}

// TestKernelFailureRollsBack: a kernel step failing in the middle of GRANT
// (the fifth rule on one prefix, a delegation chain too deep) rolls the whole
// grant back: no live handle, no rule, a rolledback tombstone, nothing open.
// Memory twin: TestMemoryKernelFailureRollsBack.
func TestKernelFailureRollsBack(t *testing.T) {
	d, _ := newKernel(t)
	events := &eventLog{}
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Events = events })
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	xp := netip.MustParseAddrPort(x).Port()
	c := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Ports: []PortRange{{Lo: xp, Hi: xp}, {Lo: 1001, Hi: 1001}, {Lo: 1002, Hi: 1002}, {Lo: 1003, Hi: 1003}, {Lo: 1004, Hi: 1004}}}}
	_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: c, Lifecycle: LifecycleSession})
	if !errors.Is(err, ErrKernel) || !errors.Is(err, dataplane.ErrRulesFull) {
		t.Fatalf("err = %v, want ErrKernel wrapping ErrRulesFull", err)
	}
	if n := len(liveHandles(t, d)); n != 0 {
		t.Fatalf("live handles after rollback: %d", n)
	}
	if rs := kernelRules(t, d, "s1"); len(rs) != 0 {
		t.Fatalf("rules after rollback: %v", rs)
	}
	gs := a.Grants("s1")
	if len(gs) != 1 || gs[0].Phase != PhaseRolledBack {
		t.Fatalf("grants after rollback: %+v", gs)
	}
	if !slices.Contains(events.kinds(), "grant.rollback") {
		t.Fatalf("no rollback event: %v", events.kinds())
	}
	p := startProbe(t, d, "s1")
	if got := p.DoAsync("tcp " + x); got != "err EPERM" {
		t.Fatalf("rolled-back grant is open: %s", got)
	}

	// A delegation chain deeper than the kernel walks (domain-only grants:
	// handles and no rules).
	dom := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"**.example.com"}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
	_, err = a.Grant(ctx, GrantRequest{Session: "s1", Capability: dom, Lifecycle: LifecycleSession})
	var are *ApprovalRequiredError
	if !errors.As(err, &are) {
		t.Fatalf("domain egress should ask: %v", err)
	}
	g, err := a.Approve(ctx, are.ID, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if doms := a.EgressDomains("s1"); len(doms["**.example.com"]) != 1 {
		t.Fatalf("EgressDomains = %v", doms)
	}
	tok := g.Handle
	var chainErr error
	for i := 0; i < dataplane.MaxChain+1 && chainErr == nil; i++ {
		var cg *Grant
		cg, chainErr = a.Attenuate(ctx, tok, GrantRequest{Session: "s1", Capability: dom, Lifecycle: LifecycleSession})
		if chainErr == nil {
			tok = cg.Handle
		}
	}
	if !errors.Is(chainErr, dataplane.ErrChainTooDeep) {
		t.Fatalf("deep chain: %v", chainErr)
	}
	if n := len(liveHandles(t, d)); n != dataplane.MaxChain {
		t.Fatalf("live handles = %d, want %d (the failed link rolled back)", n, dataplane.MaxChain)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if n := len(liveHandles(t, d)); n != 0 {
		t.Fatalf("live handles after revoking the root of the chain: %d", n)
	}
}
