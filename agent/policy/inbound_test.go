package policy

import (
	"net/netip"
	"testing"

	"github.com/shinken-agent/shinken/agent/capability"
)

// TestInboundPolicy: the Cedar policy of net.inbound: an inbound grant
// answers "accept" from a covered peer to a covered local port and nothing
// else; an egress grant never answers "accept". The grammar half is
// agent/capability's TestInboundGrammar.
func TestInboundPolicy(t *testing.T) {
	ms, err := capability.ParseManifests("m", []byte("image web\nallow net.inbound cidrs=10.0.0.0/8,192.0.2.7 ports=8080,9000-9010 tier=ask\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := ms[0].Entries[0].Capability
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
