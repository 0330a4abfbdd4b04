package agent

// The policies in force, in the backend (forbids.go): written once
// (testForbidInKernel, testNeverFollowsPolicy) and run on the memory
// backend here and on the kernel with real connects
// (forbids_kernel_linux_test.go).

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// TestForbidInTheBackend: testForbidInKernel on the memory backend.
func TestForbidInTheBackend(t *testing.T) {
	d := memKernel(t)
	testForbidInKernel(t, d, memReach(d), "127.0.0.7:8080")
}

// TestNeverExceptionFollowsPolicy: testNeverFollowsPolicy on the memory
// backend.
func TestNeverExceptionFollowsPolicy(t *testing.T) {
	d := memKernel(t)
	testNeverFollowsPolicy(t, d, memReach(d), "127.0.0.6:9100")
}

// testForbidInKernel: a session holding a 0.0.0.0/0 grant reaches target;
// an admin forbid naming target's address, applied, refuses it in the
// backend (not only at decide time); the status report names it as in the
// kernel; removing the forbid gives the reach back; a forbid on a name is
// reported as enforced at decide time only by policy diff.
func testForbidInKernel(t *testing.T, d Kernel, can reach, target string) {
	ap := netip.MustParseAddrPort(target)
	a, _ := neverAgent(t, d, "127.0.0.6:9100")
	can = agreeing(a, can)
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}}, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	if !can(t, "s1", target) {
		t.Fatalf("%s under 0.0.0.0/0: denied", target)
	}
	for _, dst := range []string{"169.254.169.254:80", "127.0.0.6:9100"} {
		if can(t, "s1", dst) {
			t.Fatalf("never-listed %s under 0.0.0.0/0: reached", dst)
		}
	}
	forbid := fmt.Sprintf(`@id("admin.no-target") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("%s/32") && context.request.port_keys.contains("%d/16") };`, ap.Addr(), ap.Port())
	rep, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"deny.cedar": forbid}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Forbids == nil || !slices.Contains(rep.Forbids.InKernel, "admin.no-target") {
		t.Errorf("apply report: forbids %+v, want admin.no-target in the kernel", rep.Forbids)
	}
	if can(t, "s1", target) {
		t.Fatalf("%s after an admin forbid naming it: allowed by the backend", target)
	}
	if d, err := a.Decide("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()}); err != nil || d.Allowed {
		t.Fatalf("decide after the forbid: %+v %v", d, err)
	}
	other := netip.AddrPortFrom(ap.Addr(), ap.Port()+1)
	if _, err := a.Decide("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: other.Addr(), Port: other.Port()}); err != nil {
		t.Fatal(err)
	}
	if st := a.Forbids(); !slices.Contains(st.InKernel, "admin.no-target") || len(st.DecideTimeOnly) != 1 || st.DecideTimeOnly[0].ID != "hard.egress-no-tls.use" {
		t.Errorf("status: %+v, want admin.no-target in the kernel and only hard.egress-no-tls.use at decide time", st)
	}
	byName := `@id("admin.by-name") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.domain_keys.contains("evil.example") };`
	diff, err := a.PolicyDiff(PolicyChange{Files: map[string]string{"name.cedar": byName}})
	if err != nil {
		t.Fatal(err)
	}
	if diff.Forbids == nil || !slices.ContainsFunc(diff.Forbids.DecideTimeOnly, func(d DecideOnlyForbid) bool { return d.ID == "admin.by-name" && d.Why != "" }) {
		t.Errorf("policy diff: forbids %+v, want admin.by-name at decide time only", diff.Forbids)
	}
	// The forbid removed (a widening, applied on purpose): reachable again.
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"deny.cedar": "// none\n"}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	if !can(t, "s1", target) {
		t.Fatalf("%s after the forbid was removed: denied", target)
	}
}

// testNeverFollowsPolicy: a grant naming a never-listed listener (own)
// that an admin permit names reaches it; removing the permit takes the
// exception back from the live grant (no revoke needed), in the backend
// and in the grant's record; putting the permit back gives it again.
func testNeverFollowsPolicy(t *testing.T, d Kernel, can reach, own string) {
	a, ap := neverAgent(t, d, own)
	can = agreeing(a, can)
	admin := fmt.Sprintf(`@id("admin.own-for-s1") permit (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("%s/32") };`, ap.Addr())
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"own.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	named := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), 32)}, Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}}}}
	g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	if !can(t, "s1", own) {
		t.Fatal("a grant naming the listener an admin permit names: denied")
	}
	neverOK := func() bool {
		a.mu.Lock()
		defer a.unlock()
		return a.st.Grants[g.ID].Delta.Egress[0].NeverOK
	}
	// The permit removed: a narrowing, through the gate.
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"own.cedar": "// none\n"}}); err != nil {
		t.Fatal(err)
	}
	if can(t, "s1", own) {
		t.Fatal("the admin permit removed: the live grant still reaches the never-listed listener")
	}
	if neverOK() {
		t.Error("the grant's record still says never-ok")
	}
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"own.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	if !can(t, "s1", own) {
		t.Fatal("the admin permit back: denied")
	}
	if !neverOK() {
		t.Error("the grant's record does not say never-ok")
	}
}

// agreeing is can that also asks the agent's Decide about the same
// connect and fails the test when the two disagree (/v1/decide says what
// the kernel does, the never-list and the deny table included).
func agreeing(a *Agent, can reach) reach {
	return func(t *testing.T, session, dst string) bool {
		t.Helper()
		ap := netip.MustParseAddrPort(dst)
		d, err := a.Decide(session, UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()})
		if err != nil {
			t.Fatalf("decide %s: %v", dst, err)
		}
		got := can(t, session, dst)
		if got != d.Allowed {
			t.Fatalf("%s from %s: the backend says reachable=%v, Decide allowed=%v (%v)", dst, session, got, d.Allowed, d.Reasons)
		}
		return got
	}
}
