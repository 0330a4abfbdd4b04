package agent

// The agent keeps an attached resolver's policies in step with the grants,
// on the memory backend (no root, any GOOS).

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/shinken-agent/shinken/dnsresolver"
)

// fakeDNS records what the agent gives the resolver.
type fakeDNS struct {
	mu  sync.Mutex
	pol map[string][]string // session → domain patterns
	log []string
}

func (f *fakeDNS) SetPolicy(s string, p dnsresolver.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var doms []string
	for _, g := range p.Grants {
		doms = append(doms, g.Pattern)
	}
	f.pol[s] = doms
	f.log = append(f.log, "set "+s)
	return nil
}

func (f *fakeDNS) RemovePolicy(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pol, s)
	f.log = append(f.log, "remove "+s)
}

func (f *fakeDNS) SetDecide(dnsresolver.DecideFunc) {}
func (f *fakeDNS) DecisionsChanged()                {}

func (f *fakeDNS) domains(s string) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.pol[s]
	return d, ok
}

// TestDNSFollowsGrants: an attached resolver gets every session's policy at
// once, and the policy of a session whose grants change before the call that
// changed them returns; an ended session's policy is removed.
func TestDNSFollowsGrants(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1"})
	f := &fakeDNS{pol: map[string][]string{}}
	a.AttachDNS(f)
	if doms, ok := f.domains("s1"); !ok || len(doms) != 0 {
		t.Fatalf("at attach: %v %v", doms, ok)
	}
	c := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"api.example.com"}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
	_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: c, Lifecycle: LifecycleSession})
	var are *ApprovalRequiredError
	if !errors.As(err, &are) {
		t.Fatalf("want an approval, got %v", err)
	}
	g, err := a.Approve(ctx, are.ID, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if doms, _ := f.domains("s1"); !slices.Equal(doms, []string{"api.example.com"}) {
		t.Fatalf("after the grant: %v (log %v)", doms, f.log)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if doms, _ := f.domains("s1"); len(doms) != 0 {
		t.Fatalf("after the revoke: %v", doms)
	}
	if err := a.EndSession("s1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.domains("s1"); ok || !slices.Contains(f.log, "remove s1") {
		t.Fatalf("after the session ended: log %v", f.log)
	}
}

// TestDNSSkipsUnchangedPolicy: a grant or revoke that leaves a session's
// resolver policy as it was (an address grant: no domain) does not give the
// resolver the policy again, which would void the session's prepared
// replies and remembered decisions; a domain grant does, and so does a new
// resolver (AttachDNS), once.
func TestDNSSkipsUnchangedPolicy(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1"})
	f := &fakeDNS{pol: map[string][]string{}}
	a.AttachDNS(f)
	grant := func(e *EgressScope) string {
		t.Helper()
		r, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: Capability{Class: ClassNetEgress, Egress: e}, Lifecycle: LifecycleSession})
		if err == nil {
			return r.Handle
		}
		var are *ApprovalRequiredError
		if !errors.As(err, &are) {
			t.Fatalf("want a grant or an approval, got %v", err)
		}
		g, err := a.Approve(ctx, are.ID, "alice")
		if err != nil {
			t.Fatal(err)
		}
		return g.Handle
	}
	sets := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, l := range f.log {
			if l == "set s1" {
				n++
			}
		}
		return n
	}
	https := []PortRange{{Lo: 443, Hi: 443}}
	grant(&EgressScope{Domains: []string{"api.example.com"}, Ports: https})
	before := sets()
	addr := grant(&EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.7/32")}, Ports: https})
	if err := a.Revoke(ctx, addr); err != nil {
		t.Fatal(err)
	}
	if n := sets() - before; n != 0 {
		t.Fatalf("an address grant and its revoke gave the resolver the same policy %d more times (log %v)", n, f.log)
	}
	grant(&EgressScope{Domains: []string{"cdn.example.com"}, Ports: https})
	if doms, _ := f.domains("s1"); sets()-before != 1 || !slices.Equal(doms, []string{"api.example.com", "cdn.example.com"}) {
		t.Fatalf("a domain grant: %d policies given, domains %v", sets()-before, doms)
	}
	g := &fakeDNS{pol: map[string][]string{}}
	a.AttachDNS(g)
	if doms, ok := g.domains("s1"); !ok || len(doms) != 2 {
		t.Fatalf("a new resolver did not get the session's policy: %v %v", doms, ok)
	}
}
