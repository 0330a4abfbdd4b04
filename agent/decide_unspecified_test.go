package agent

import (
	"net/netip"
	"testing"
)

// TestDecideUnspecified: a use-time decision about an unspecified
// destination is the decision about loopback, as the kernel's hooks rewrite
// the address before they decide (issue 22: /v1/decide and the kernel must
// agree).
func TestDecideUnspecified(t *testing.T) {
	m := newMemoryAgent(t)
	m.session(t, "s1")
	m.grant(t, GrantRequest{Session: "s1", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassNetEgress,
		Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}, Ports: []PortRange{{Lo: 8080, Hi: 8080}}}}})
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"127.0.0.1", true}, {"0.0.0.0", true}, {"::ffff:0.0.0.0", true}, {"::", true}, {"::1", true},
		{"127.0.0.2", false}, {"10.0.0.1", false},
	} {
		d, err := m.DecideUse("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr(tc.ip), Port: 8080})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != tc.want {
			t.Errorf("connect %s:8080: allowed=%v (%s), want %v", tc.ip, d.Allowed, d.DecidedBy, tc.want)
		}
	}
	for _, k := range []struct{ in, out string }{{"0.0.0.0", "127.0.0.1"}, {"::ffff:0.0.0.0", "127.0.0.1"}, {"::", "::1"}, {"10.1.2.3", "10.1.2.3"}, {"::ffff:10.1.2.3", "::ffff:10.1.2.3"}} {
		if got := kernelDestination(netip.MustParseAddr(k.in)); got != netip.MustParseAddr(k.out) {
			t.Errorf("kernelDestination(%s) = %s, want %s", k.in, got, k.out)
		}
	}
}
