package agent

import (
	"net/netip"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane"
)

// TestRevokeIsOneWrite holds the revoke path to the design's promise,
// counted by the backend: revoking a leaf grant is exactly one handle-state
// write and at most one socket sweep; revoking a parent with N descendants
// is still one write and one sweep (the kernel's parent walk kills the
// subtree; the agent then only reclaims rules and slots). Memory twin:
// TestMemoryRevokeIsOneWrite.
func TestRevokeIsOneWrite(t *testing.T) {
	d, _ := newKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	y := listenTCP(t, "127.0.0.3:0")
	wantSweeps := uint64(0)
	if d.FlowMode() == dataplane.FlowSweep {
		wantSweeps = 1
	}
	p := startProbe(t, d, "s1")
	revoke := func(t *testing.T, token string) backend.Ops {
		t.Helper()
		before := d.Ops()
		if err := a.Revoke(ctx, token); err != nil {
			t.Fatal(err)
		}
		after := d.Ops()
		return backend.Ops{RevokeWrites: after.RevokeWrites - before.RevokeWrites, Sweeps: after.Sweeps - before.Sweeps}
	}

	t.Run("leaf", func(t *testing.T) {
		g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.DoAsync("tcp " + x); got != "ok" {
			t.Fatalf("granted connect: %s", got)
		}
		ops := revoke(t, g.Handle)
		t.Logf("leaf revoke: %d revoke writes, %d sweeps (flow mode %s)", ops.RevokeWrites, ops.Sweeps, d.FlowMode())
		if ops.RevokeWrites != 1 || ops.Sweeps != wantSweeps {
			t.Fatalf("leaf revoke ran %d revoke writes and %d sweeps, want 1 and %d", ops.RevokeWrites, ops.Sweeps, wantSweeps)
		}
		if got := p.DoAsync("tcp " + x); got != "err EPERM" {
			t.Fatalf("connect after revoke: %s, want err EPERM", got)
		}
		// Idempotent: a second revoke writes nothing and sweeps nothing.
		if ops := revoke(t, g.Handle); ops.RevokeWrites != 0 || ops.Sweeps != 0 {
			t.Fatalf("second revoke ran %+v, want nothing", ops)
		}
	})

	t.Run("parent with descendants", func(t *testing.T) {
		parent := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/29")}}}
		pg, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: parent, Lifecycle: LifecycleSession})
		if err != nil {
			t.Fatal(err)
		}
		// Five descendants: three children, one grandchild, one
		// great-grandchild (these two narrow the first child: its
		// destination); the children on three destinations, as a prefix
		// holds at most four rules.
		dsts := []string{x, y, listenTCP(t, "127.0.0.4:0")}
		var tokens []string
		for i := 0; i < 3; i++ {
			c, err := a.Attenuate(ctx, pg.Handle, GrantRequest{Session: "s1", Capability: loopEgress(dsts[i]), Lifecycle: LifecycleSession})
			if err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, c.Handle)
		}
		gc, err := a.Attenuate(ctx, tokens[0], GrantRequest{Session: "s1", Capability: loopEgress(dsts[0]), Lifecycle: LifecycleSession})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Attenuate(ctx, gc.Handle, GrantRequest{Session: "s1", Capability: loopEgress(dsts[0]), Lifecycle: LifecycleSession}); err != nil {
			t.Fatal(err)
		}
		if n := len(liveHandles(t, d)); n != 6 {
			t.Fatalf("%d live handles before the revoke, want 6", n)
		}
		for _, dst := range dsts {
			if got := p.DoAsync("tcp " + dst); got != "ok" {
				t.Fatalf("granted connect to %s: %s", dst, got)
			}
		}
		ops := revoke(t, pg.Handle)
		t.Logf("revoke of a parent with 5 descendants: %d revoke writes, %d sweeps", ops.RevokeWrites, ops.Sweeps)
		if ops.RevokeWrites != 1 || ops.Sweeps != wantSweeps {
			t.Fatalf("parent revoke ran %d revoke writes and %d sweeps, want 1 and %d", ops.RevokeWrites, ops.Sweeps, wantSweeps)
		}
		for _, dst := range dsts {
			if got := p.DoAsync("tcp " + dst); got != "err EPERM" {
				t.Fatalf("connect to %s after the parent's revoke: %s, want err EPERM", dst, got)
			}
		}
		// Everything was reclaimed: no handle slot, no rule left.
		if h, err := d.Handles(); err != nil || len(h) != 0 {
			t.Fatalf("handle slots left after the revoke: %v (%v)", h, err)
		}
		if r := kernelRules(t, d, "s1"); len(r) != 0 {
			t.Fatalf("rules left after the revoke: %v", r)
		}
		for _, g := range a.Grants("s1") {
			if g.Phase != PhaseRevoked {
				t.Fatalf("grant %s is %s after the revoke", g.ID, g.Phase)
			}
		}
	})
}
