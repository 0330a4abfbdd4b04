package capability

import (
	"errors"
	"net/netip"
	"testing"
)

// TestInboundGrammar: net.inbound in the manifest syntax, its rendering,
// containment (a child never widens it) and its default tier. Its Cedar
// policy is agent/policy's TestInboundPolicy.
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
}
