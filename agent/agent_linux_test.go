package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
)

// TestGrantRevokeEndToEnd: a grant opens exactly its destination in the
// kernel; revoke closes it at the next connect; revoke is idempotent; a
// revoked handle replays to ErrHandleRevoked; a forged one is refused.
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
// parent kills the child in the kernel at once.
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

// TestGrantRefusals: every refusal of the gate leaves state and kernel as
// they were.
func TestGrantRefusals(t *testing.T) {
	d, _ := newKernel(t)
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Breaker = BreakerConfig{Consecutive: 100, Total: 100} })
	mustSession(t, a, SessionSpec{ID: "s1", Workspace: "/work"})
	low := SessionSpec{ID: "low", TrustTier: "low"}
	mustSession(t, a, low)
	high := SessionSpec{ID: "high", Risk: "high"}
	mustSession(t, a, high)
	x := listenTCP(t, "127.0.0.2:0")
	cases := []struct {
		name string
		req  GrantRequest
		want error
	}{
		{"outside manifest", GrantRequest{Session: "s1", Capability: loopEgress("10.0.0.1:80"), Lifecycle: LifecycleSession}, ErrOutsideManifest},
		{"undeclared class", GrantRequest{Session: "s1", Capability: Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "compute"}}, Lifecycle: LifecycleSession}, ErrOutsideManifest},
		{"block tier (credentials)", GrantRequest{Session: "s1", Capability: Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"github:read"}, NeverRaw: true}}, Lifecycle: LifecycleSession}, ErrBlockTier},
		{"never_raw false", GrantRequest{Session: "s1", Capability: Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"github:read"}}}, Lifecycle: LifecycleSession}, ErrInvalidCapability},
		{"not enforceable (fs.scope)", GrantRequest{Session: "s1", Capability: fsCap([]string{"/work/src"}, nil, nil), Lifecycle: LifecycleSession}, ErrNotEnforceable},
		{"not enforceable (clipboard)", GrantRequest{Session: "s1", Capability: Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, Lifecycle: LifecycleSession}, ErrNotEnforceable},
		{"standing in session", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleStanding}, ErrStandingInSession},
		{"bad lifecycle", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: "forever"}, ErrInvalidRequest},
		{"empty capability", GrantRequest{Session: "s1", Capability: Empty(ClassNetEgress), Lifecycle: LifecycleSession}, ErrInvalidRequest},
		{"unknown session", GrantRequest{Session: "nope", Capability: loopEgress(x), Lifecycle: LifecycleSession}, ErrUnknownSession},
		{"external ask → block", GrantRequest{Session: "s1", Capability: loopEgress("127.0.1.1:80"), Lifecycle: LifecycleSession, Provenance: External}, ErrBlockTier},
		{"external auto → ask", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession, Provenance: External}, ErrApprovalRequired},
		{"first-party ask", GrantRequest{Session: "s1", Capability: loopEgress("127.0.1.1:80"), Lifecycle: LifecycleSession}, ErrApprovalRequired},
		{"egress without TLS inspection, high risk (hard deny)", GrantRequest{Session: "high", Capability: loopEgress(x), Lifecycle: LifecycleSession}, ErrDenied},
		{"forged parent", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession, Parent: "shk1_" + strings.Repeat("a", 52)}, ErrForgedHandle},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.Grants(""))
			_, err := a.Grant(ctx, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if n := len(liveHandles(t, d)); n != 0 {
				t.Fatalf("refusal left %d live kernel handles", n)
			}
			if n := len(a.Grants("")); n != before {
				t.Fatalf("refusal added grant records (%d → %d)", before, n)
			}
		})
	}
	if n := len(a.PendingApprovals()); n != 2 {
		t.Fatalf("pending approvals = %d, want 2", n)
	}
}

// TestRestartAndDrift: state survives a restart; reconcile repairs drift in
// the fail-closed direction.
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

// TestManifestDirReload: a broken manifest file is rejected with file:line
// and the previous manifests keep deciding.
func TestManifestDirReload(t *testing.T) {
	d, _ := newKernel(t)
	mdir := t.TempDir()
	writeFile(t, mdir+"/py.manifest", "image py\nallow net.egress cidrs=127.0.0.0/24\n")
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Manifests = nil; c.ManifestDir = mdir })
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	writeFile(t, mdir+"/py.manifest", "image py\nallow net.egress cidrs=127.0.0.0/24\nallow net.egres cidrs=10.0.0.0/8\n")
	if err := a.ReloadManifests(); !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), `py.manifest:3: unknown class "net.egres"`) {
		t.Fatalf("reload: %v", err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
		t.Fatalf("previous manifest not in force: %v", err)
	}
	writeFile(t, mdir+"/py.manifest", "image py\nallow net.egress cidrs=127.0.1.0/24\n")
	if err := a.ReloadManifests(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrOutsideManifest) {
		t.Fatalf("narrowed manifest: %v", err)
	}
}

// TestConcurrentUse: decisions run concurrently with grants, revokes and
// session churn (run with -race).
func TestConcurrentUse(t *testing.T) {
	d, _ := newKernel(t)
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Breaker = BreakerConfig{Consecutive: 1 << 30, Total: 1 << 30} })
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	ap := netip.MustParseAddrPort(x)
	use := UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := a.Decide("s1", use); err != nil {
					t.Error(err)
					return
				}
				a.Breaker("s1")
			}
		}()
	}
	for i := 0; i < 30; i++ {
		g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
		if err != nil {
			t.Fatal(err)
		}
		sid := fmt.Sprintf("tmp%d", i)
		mustSession(t, a, SessionSpec{ID: sid})
		if err := a.Revoke(ctx, g.Handle); err != nil {
			t.Fatal(err)
		}
		if err := a.EndSession(sid); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if n := len(liveHandles(t, d)); n != 0 {
		t.Fatalf("live handles: %d", n)
	}
}

// TestTwoOfThreeGate: a Notify grant that would complete the three
// ingredients goes to a human instead; without them it runs with a notice.
func TestTwoOfThreeGate(t *testing.T) {
	d, _ := newKernel(t)
	events := &eventLog{}
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Events = events })
	mustSession(t, a, SessionSpec{ID: "plain"})
	mustSession(t, a, SessionSpec{ID: "risky"})
	pub := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
	g, err := a.Grant(ctx, GrantRequest{Session: "plain", Capability: pub, Lifecycle: LifecycleSession})
	if err != nil || g.Tier != TierNotify {
		t.Fatalf("plain session: %+v %v", g, err)
	}
	if !slices.Contains(events.kinds(), "grant.notify") {
		t.Fatalf("no notice for a Notify grant: %v", events.kinds())
	}
	if err := a.NoteIngredients("risky", Ingredients{ExternalIngestion: true, CredentialAccess: true}); err != nil {
		t.Fatal(err)
	}
	_, err = a.Grant(ctx, GrantRequest{Session: "risky", Capability: pub, Lifecycle: LifecycleSession})
	var are *ApprovalRequiredError
	if !errors.As(err, &are) || are.Tier != TierAsk {
		t.Fatalf("third ingredient unattended: %v", err)
	}
	if err := a.NoteIngredients("nope", Ingredients{}); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("unknown session: %v", err)
	}
}

// TestPolicyStoreIsForbidden: whatever a session was granted, writing the
// agent's state, policy or manifest directories is denied by Cedar.
func TestPolicyStoreIsForbidden(t *testing.T) {
	d, _ := newKernel(t)
	state, pol, man := t.TempDir(), t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(man, "py.manifest"), "image py\nallow clipboard paste_in=true\n")
	// A standing admin permit that would allow every fs write.
	writeFile(t, filepath.Join(pol, "admin.cedar"), `@id("admin.all-writes") permit(principal, action == Shinken::Action::"use", resource == Shinken::Capability::"fs.scope");`)
	a := openAgent(t, d, state, func(c *Config) { c.Manifests, c.ManifestDir, c.PolicyDir = nil, man, pol })
	mustSession(t, a, SessionSpec{ID: "s1"})
	for _, p := range []string{filepath.Join(state, "state.json"), filepath.Join(pol, "x.cedar"), filepath.Join(man, "py.manifest")} {
		dec, err := a.Decide("s1", UseRequest{Class: ClassFSScope, Op: "write", Path: p})
		if err != nil {
			t.Fatal(err)
		}
		if dec.Allowed || !slices.Contains(dec.Reasons, "hard.policy-store.use") {
			t.Errorf("write %s: %+v", p, dec)
		}
	}
	if dec, _ := a.Decide("s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/work/x"}); !dec.Allowed {
		t.Fatalf("the admin permit itself does not work: %+v", dec)
	}
}
