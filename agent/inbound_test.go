package agent

import (
	"errors"
	"net/netip"
	"testing"
)

// TestInboundGrammar: net.inbound in the manifest syntax, its rendering,
// containment (a child never widens it), its default tier, and its Cedar
// policy: an inbound grant answers "accept" from a covered peer to a covered
// local port and nothing else; an egress grant never answers "accept".
func TestInboundGrammar(t *testing.T) {
	ms, err := ParseManifests("m", []byte("image web\nallow net.inbound cidrs=10.0.0.0/8,192.0.2.7 ports=8080,9000-9010 tier=ask\nescalate net.inbound\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := ms[0].Entries[0].Capability
	if got, want := c.String(), "net.inbound cidrs=10.0.0.0/8,192.0.2.7/32 ports=8080,9000-9010"; got != want {
		t.Errorf("String: %q, want %q", got, want)
	}
	if got, want := c.Summary(), "from 10.0.0.0/8,192.0.2.7/32 ports=8080,9000-9010"; got != want {
		t.Errorf("Summary: %q, want %q", got, want)
	}
	if len(ms[0].Escalate) != 1 || ms[0].Escalate[0] != ClassNetInbound {
		t.Errorf("escalate: %v", ms[0].Escalate)
	}
	for _, bad := range []string{"allow net.inbound domains=example.com", "allow net.inbound tls_inspect=true", "allow net.inbound cidrs=10.0.0.1/8"} {
		if _, err := ParseManifests("m", []byte("image x\n"+bad+"\n")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	in := func(cidr string, ports ...PortRange) Capability {
		return Capability{Class: ClassNetInbound, Inbound: &InboundScope{CIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}, Ports: ports}}
	}
	if err := in("10.1.0.0/16", PortRange{8080, 8080}).Within(c); err != nil {
		t.Errorf("narrower: %v", err)
	}
	for _, w := range []Capability{in("0.0.0.0/0", PortRange{8080, 8080}), in("10.1.0.0/16", PortRange{8081, 8081}), in("10.1.0.0/16"),
		{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}} {
		if err := w.Within(c); !errors.Is(err, ErrWidens) {
			t.Errorf("%s within %s: %v", w, c, err)
		}
	}
	if got := DefaultTier(in("127.0.0.1/32"), TierContext{}); got != TierAsk {
		t.Errorf("default tier of loopback inbound: %s, want ask", got)
	}
	if !(Ingredients{}).With(in("0.0.0.0/0"), FirstParty).ExternalCommunication {
		t.Error("inbound from anywhere is no external communication")
	}

	e := newTestEngine(t, "")
	e.PutSession(testSession("s1"))
	for _, g := range []GrantData{
		{ID: "g-in", Session: "s1", Capability: c},
		{ID: "g-out", Session: "s1", Capability: egress([]string{"203.0.113.0/24"}, nil)},
	} {
		if err := e.PutGrant(g); err != nil {
			t.Fatal(err)
		}
		if err := ProveGrant(g, t0); err != nil {
			t.Errorf("ProveGrant(%s): %v", g.ID, err)
		}
	}
	for _, tc := range []struct {
		req  UseRequest
		want bool
	}{
		{UseRequest{Class: ClassNetInbound, Op: "accept", IP: netip.MustParseAddr("10.2.3.4"), Port: 8080}, true},
		{UseRequest{Class: ClassNetInbound, Op: "accept", IP: netip.MustParseAddr("192.0.2.7"), Port: 9005}, true},
		{UseRequest{Class: ClassNetInbound, Op: "accept", IP: netip.MustParseAddr("10.2.3.4"), Port: 8081}, false},
		{UseRequest{Class: ClassNetInbound, Op: "accept", IP: netip.MustParseAddr("11.0.0.1"), Port: 8080}, false},
		{UseRequest{Class: ClassNetInbound, Op: "connect", IP: netip.MustParseAddr("10.2.3.4"), Port: 8080}, false},
		{UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("10.2.3.4"), Port: 8080}, false},
		{UseRequest{Class: ClassNetInbound, Op: "accept", IP: netip.MustParseAddr("203.0.113.9"), Port: 8080}, false},
		{UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("203.0.113.9"), Port: 8080}, true},
	} {
		d, err := e.Decide("s1", tc.req, t0)
		if err != nil || d.Allowed != tc.want {
			t.Errorf("%+v: allowed %v (%v), want %v", tc.req, d.Allowed, err, tc.want)
		}
	}
}
