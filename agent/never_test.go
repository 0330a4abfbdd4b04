package agent

// The never-list through the agent, on the memory backend (no root, any
// GOOS): its Connect checks the never-list and the admin-named exceptions
// as the kernel hooks do (the kernel's own are dataplane's never tests).

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// TestNeverListThroughTheAgent: a 0.0.0.0/0 grant does not reach
// 169.254.169.254 nor the agent's own listener; a grant naming the listener
// reaches it only once an admin policy names it (its rule is NeverOK).
func TestNeverListThroughTheAgent(t *testing.T) {
	const own = "127.0.0.6:9100" // stands for the agent's metrics listener
	const other = "127.0.0.7:8080"
	a, d, ap := neverAgent(t, own)
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}}, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"169.254.169.254:80", own} {
		if got := connectTCP(t, d, "s1", dst); got == backend.ReasonNone {
			t.Errorf("%s after a 0.0.0.0/0 grant: allowed, want denied", dst)
		}
	}
	wantAllowed(t, d, "s1", other) // an ordinary destination under 0.0.0.0/0
	named := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), 32)}, Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}}}}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	wantDenied(t, d, "s1", own) // a grant naming the listener, no admin policy
	admin := fmt.Sprintf(`@id("admin.metrics-for-s1") permit (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("%s/32") };`, ap.Addr())
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"metrics.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	wantAllowed(t, d, "s1", own) // a grant naming the listener that an admin policy names
}

// TestNeverExceptionTwoGrants: two grants of one session naming the same
// never-listed destination (an admin policy names it) share the backend's one
// exception entry: revoking one leaves the other's reach, revoking both
// ends it.
func TestNeverExceptionTwoGrants(t *testing.T) {
	const own = "127.0.0.6:9100" // stands for a metadata address
	a, d, ap := neverAgent(t, own)
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
	wantAllowed(t, d, "s1", own) // two grants naming it
	if err := a.Revoke(ctx, g1.Handle); err != nil {
		t.Fatal(err)
	}
	wantAllowed(t, d, "s1", own) // the first grant revoked, the second live
	if err := a.Revoke(ctx, g2.Handle); err != nil {
		t.Fatal(err)
	}
	wantDenied(t, d, "s1", own) // both revoked
}

// neverAgent: a backend whose never-list is the default plus listener, an
// agent whose manifest allows net.egress 0.0.0.0/0 (tier auto), with a
// policy directory, and its session s1.
func neverAgent(t *testing.T, listener string) (*Agent, *memory.Backend, netip.AddrPort) {
	t.Helper()
	needZ3(t)
	d := memKernel(t)
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
