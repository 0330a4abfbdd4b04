package policy

import (
	"net/netip"
	"strings"
	"testing"
)

// TestGateForbidRemovedUnderGrant (issue 22, shape 1): removing (or
// narrowing) an admin forbid on 10.0.0.0/8 while a session holds a
// 0.0.0.0/0:443 grant makes Decide allow 10.1.2.3:443: the gate must
// report it as widening, with a counterexample the authorizer confirms
// under a live grant.
func TestGateForbidRemovedUnderGrant(t *testing.T) {
	needZ3(t)
	e := newTestEngine(t, "")
	forbid := `@id("admin.no-10") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("10.0.0.0/8") };`
	narrowed := strings.Replace(forbid, "10.0.0.0/8", "10.1.0.0/16", 1)
	for _, tc := range []struct{ name, old, neu string }{
		{"removed", forbid, ""},
		{"narrowed", forbid, narrowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := e.CheckShift(withPolicies(t, e, tc.old), withPolicies(t, e, tc.neu))
			if !rep.Widens() {
				t.Fatalf("%s forbid under a live 0.0.0.0/0:443 grant: %s, want widening", tc.name, rep.Summary())
			}
			if ce := rep.Counterexample; ce == nil || ce.Use == nil || !netip.MustParsePrefix("10.0.0.0/8").Contains(ce.Use.IP) {
				t.Fatalf("counterexample %v, want a use request in 10.0.0.0/8 (%s)", ce, rep.Summary())
			}
			t.Logf("%s", rep.Summary())
		})
	}
	// Adding a forbid stays non-widening by construction.
	if rep := e.CheckShift(withPolicies(t, e, ""), withPolicies(t, e, forbid)); rep.Widens() || !rep.Proved {
		t.Fatalf("adding the forbid: %s", rep.Summary())
	}
}

// TestGatePrunedKeys (issue 22, shape 2): Decide builds cidr_keys and
// port_keys only at the lengths some policy or grant names, so a policy
// that observes those sets beyond "contains this literal" (isEmpty, a
// non-literal element, ...) changes meaning when an edit adds a length,
// even an edit that only adds a forbid. The gate must refuse such an edit
// as unproven; here it would widen: the standing permit for port 443 is
// held back by the "no address key" forbid until a forbid naming a /16
// makes cidr_keys non-empty.
func TestGatePrunedKeys(t *testing.T) {
	needZ3(t)
	e := newTestEngine(t, "")
	base := `@id("admin.443") permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.port_keys.contains("443/16") };
@id("admin.keyless") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.isEmpty() };`
	added := base + "\n" + `@id("admin.no-192") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("192.168.0.0/16") };`
	old, neu := withPolicies(t, e, base), withPolicies(t, e, added)
	// The widening, shown with the production engine: a session with no
	// grant asks for 10.1.2.3:443.
	decide := func(src string) bool {
		dir := t.TempDir()
		writeFile(t, dir+"/admin.cedar", src)
		en := newTestEngine(t, dir)
		en.PutSession(testSession("s1"))
		d, err := en.Decide("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("10.1.2.3"), Port: 443}, t0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	if decide(base) || !decide(added) {
		t.Fatalf("the edit does not widen as this test assumes (old %v, new %v)", decide(base), decide(added))
	}
	rep := e.CheckShift(old, neu)
	if !rep.Widens() || rep.Proved {
		t.Fatalf("an edit under a policy reading the pruned keys: %s, want refused as unproven", rep.Summary())
	}
	if !strings.Contains(rep.Unproved, "admin.keyless") {
		t.Errorf("unproved %q does not name admin.keyless", rep.Unproved)
	}
}
