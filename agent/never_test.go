package agent

// The never-list through the agent. The cases are written once
// (testNeverList, testNeverTwoGrants) and run on the memory backend, whose
// Connect checks the never-list and the admin-named exceptions as the
// kernel hooks do (no root, any GOOS), and on the kernel with real connects
// (never_kernel_linux_test.go).

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// TestNeverListThroughTheAgent: testNeverList on the memory backend.
func TestNeverListThroughTheAgent(t *testing.T) {
	d := memKernel(t)
	testNeverList(t, d, memReach(d), "127.0.0.6:9100", "127.0.0.7:8080")
}

// TestNeverExceptionTwoGrants: testNeverTwoGrants on the memory backend.
func TestNeverExceptionTwoGrants(t *testing.T) {
	d := memKernel(t)
	testNeverTwoGrants(t, d, memReach(d), "127.0.0.6:9100")
}

// reach says whether session can open a TCP flow to dst now (false: the
// backend refused it; anything else fails the test).
type reach func(t *testing.T, session, dst string) bool

// memReach asks the memory backend's Connect.
func memReach(d *memory.Backend) reach {
	return func(t *testing.T, session, dst string) bool {
		t.Helper()
		return connectTCP(t, d, session, dst) == backend.ReasonNone
	}
}

// testNeverList: a 0.0.0.0/0 grant does not reach 169.254.169.254 nor the
// agent's own listener (own, never-listed); it reaches other; a grant
// naming own reaches it only once an admin policy names it (its rule is
// NeverOK).
func testNeverList(t *testing.T, d Kernel, can reach, own, other string) {
	a, ap := neverAgent(t, d, own)
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}}, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"169.254.169.254:80", own} {
		if can(t, "s1", dst) {
			t.Errorf("%s after a 0.0.0.0/0 grant: allowed, want denied", dst)
		}
	}
	if !can(t, "s1", other) {
		t.Fatalf("%s, an ordinary destination under 0.0.0.0/0: denied", other)
	}
	named := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), 32)}, Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}}}}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	if can(t, "s1", own) {
		t.Fatal("a grant naming the listener, no admin policy: allowed, want denied")
	}
	admin := fmt.Sprintf(`@id("admin.metrics-for-s1") permit (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("%s/32") };`, ap.Addr())
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"metrics.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	if !can(t, "s1", own) {
		t.Fatal("a grant naming the listener that an admin policy names: denied")
	}
}

// testNeverTwoGrants: two grants of one session naming the same
// never-listed destination (own; an admin policy names it) share the
// backend's one exception entry: revoking one leaves the other's reach,
// revoking both ends it.
func testNeverTwoGrants(t *testing.T, d Kernel, can reach, own string) {
	a, ap := neverAgent(t, d, own)
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
	if !can(t, "s1", own) {
		t.Fatal("two grants naming it: denied")
	}
	if err := a.Revoke(ctx, g1.Handle); err != nil {
		t.Fatal(err)
	}
	if !can(t, "s1", own) {
		t.Fatal("the first grant revoked, the second live: denied")
	}
	if err := a.Revoke(ctx, g2.Handle); err != nil {
		t.Fatal(err)
	}
	if can(t, "s1", own) {
		t.Fatal("both revoked: allowed")
	}
}

// neverAgent: an agent on d whose never-list is the default plus listener
// (the agent sets the backend's at Open), whose manifest allows net.egress
// 0.0.0.0/0 (tier auto), with a policy directory, and its session s1.
func neverAgent(t *testing.T, d Kernel, listener string) (*Agent, netip.AddrPort) {
	t.Helper()
	needZ3(t)
	ap := netip.MustParseAddrPort(listener)
	ms, err := ParseManifests("never.manifest", []byte("image py\nallow net.egress cidrs=0.0.0.0/0 tier=auto\n"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := openAgent(t, d, t.TempDir(), func(c *Config) {
		c.Manifests = map[string]*Manifest{"py": ms[0]}
		c.NeverList = []backend.NeverEntry{{Prefix: netip.PrefixFrom(ap.Addr(), 32), Port: ap.Port()}}
		c.PolicyDir = dir
	})
	mustSession(t, a, SessionSpec{ID: "s1"})
	return a, ap
}
