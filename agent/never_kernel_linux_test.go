package agent

// The never-list through the agent on the real kernel (real connects from a
// probe in the session); never_test.go runs the same cases on the memory
// backend without root.

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane"
)

// TestNeverListThroughTheKernel: a 0.0.0.0/0 grant does not reach
// 169.254.169.254 nor the agent's own listener; a grant naming the listener
// reaches it only once an admin policy names it (its rule is NeverOK).
func TestNeverListThroughTheKernel(t *testing.T) {
	own := listenTCP(t, "127.0.0.6:0") // stands for the agent's metrics listener
	other := listenTCP(t, "127.0.0.7:0")
	a, d, ap := neverKernelAgent(t, own)
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}}, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	p := startProbe(t, d, "s1")
	for _, dst := range []string{"169.254.169.254:80", own} {
		if got := p.DoAsync("tcp " + dst); got != "err EPERM" {
			t.Errorf("%s after a 0.0.0.0/0 grant: %s, want err EPERM", dst, got)
		}
	}
	if got := p.DoAsync("tcp " + other); got != "ok" {
		t.Fatalf("an ordinary destination under 0.0.0.0/0: %s", got)
	}
	named := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), 32)}, Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}}}}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + own); got != "err EPERM" {
		t.Fatalf("a grant naming the listener, no admin policy: %s, want err EPERM", got)
	}
	admin := fmt.Sprintf(`@id("admin.metrics-for-s1") permit (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("%s/32") };`, ap.Addr())
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"metrics.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + own); got != "ok" {
		t.Fatalf("a grant naming the listener that an admin policy names: %s", got)
	}
}

// TestNeverExceptionTwoGrantsKernel: two grants of one session naming the same
// never-listed destination (an admin policy names it) share the kernel's one
// exception entry: revoking one leaves the other's reach, revoking both
// ends it.
func TestNeverExceptionTwoGrantsKernel(t *testing.T) {
	own := listenTCP(t, "127.0.0.6:0") // stands for a metadata address
	a, d, ap := neverKernelAgent(t, own)
	admin := fmt.Sprintf(`@id("admin.meta-for-s1") permit (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("%s/32") };`, ap.Addr())
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"meta.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	named := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), 32)}, Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}}}}
	g1, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	g2, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	p := startProbe(t, d, "s1")
	if got := p.DoAsync("tcp " + own); got != "ok" {
		t.Fatalf("two grants naming it: %s", got)
	}
	if err := a.Revoke(ctx, g1.Handle); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + own); got != "ok" {
		t.Fatalf("the first grant revoked, the second live: %s, want ok", got)
	}
	if err := a.Revoke(ctx, g2.Handle); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + own); got != "err EPERM" {
		t.Fatalf("both revoked: %s, want err EPERM", got)
	}
}

// neverKernelAgent: a kernel whose never-list is the default plus listener, an
// agent whose manifest allows net.egress 0.0.0.0/0 (tier auto), with a
// policy directory, and its session s1.
func neverKernelAgent(t *testing.T, listener string) (*Agent, *dataplane.Dataplane, netip.AddrPort) {
	t.Helper()
	needZ3(t)
	d, _ := newKernel(t)
	ap := netip.MustParseAddrPort(listener)
	extra := []backend.NeverEntry{{Prefix: netip.PrefixFrom(ap.Addr(), 32), Port: ap.Port()}}
	if err := d.SetNeverList(append(append([]backend.NeverEntry(nil), backend.DefaultNeverList...), extra...)); err != nil {
		t.Fatal(err)
	}
	ms, err := ParseManifests("never.manifest", []byte("image py\nallow net.egress cidrs=0.0.0.0/0 tier=auto\n"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := openAgent(t, d, t.TempDir(), func(c *Config) {
		c.Manifests = map[string]*Manifest{"py": ms[0]}
		c.NeverList = extra
		c.PolicyDir = dir
	})
	mustSession(t, a, SessionSpec{ID: "s1"})
	return a, d, ap
}
