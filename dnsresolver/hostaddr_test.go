package dnsresolver

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

// TestHostAddrStripped: an address of the host itself is stripped from
// answers, public or not, unless a grant names it exactly (a /32 in
// AllowNonPublic; a wider range holding it does not); a reply prepared
// before the address became the host's is not given after.
func TestHostAddrStripped(t *testing.T) {
	host := NewHostAddrs(netip.MustParseAddr("93.184.216.35"), netip.MustParseAddr("10.1.2.3"))
	e := newTestEnv(t, func(c *Config) { c.HostAddrs = host })
	for _, tr := range []string{"udp", "tcp"} {
		for _, name := range []string{"api.allowed.test.", "internal.corp.test."} {
			resp := e.ask(t, 1, tr, name, dns.TypeA)
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
				t.Fatalf("%s over %s: %v", name, tr, resp)
			}
		}
	}
	if got := e.dp.take(); len(got) != 0 {
		t.Fatalf("entries %v for host addresses", got)
	}
	if st := e.r.Stats().Sessions["s1"]; st.HostStripped != 4 || st.Stripped < 4 {
		t.Fatalf("stats %+v", st)
	}
	// Named exactly: kept.
	pol := Policy{Grants: []Grant{
		{Pattern: "api.allowed.test", Handle: h1, AllowNonPublic: []netip.Prefix{netip.MustParsePrefix("93.184.216.35/32")}},
		{Pattern: "internal.corp.test", Handle: h1, AllowNonPublic: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.2.3/32")}},
		{Pattern: "allowed.test", Handle: h1, AllowNonPublic: []netip.Prefix{netip.MustParsePrefix("93.184.216.0/24")}},
	}}
	if err := e.r.SetPolicy("s1", pol); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		want []string
	}{{"api.allowed.test.", []string{"93.184.216.35"}}, {"internal.corp.test.", []string{"10.1.2.3"}}, {"allowed.test.", []string{"93.184.216.34"}}} {
		if got := answerAddrs(e.ask(t, 1, "udp", c.name, dns.TypeA)); !slices.Equal(got, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// allowed.test's address becomes the host's: its prepared reply goes.
	e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)
	host.Add(netip.MustParseAddr("93.184.216.34"))
	if got := answerAddrs(e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)); len(got) != 0 {
		t.Fatalf("allowed.test after its address became the host's: %v (a /24 does not name it)", got)
	}
	host.Remove(netip.MustParseAddr("93.184.216.34"))
	if got := answerAddrs(e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)); !slices.Equal(got, []string{"93.184.216.34"}) {
		t.Fatalf("allowed.test after the address left the host: %v", got)
	}
}

// TestHostAddrs: the set's Set, Add, Remove and OnChange.
func TestHostAddrs(t *testing.T) {
	var seen [][]netip.Addr
	h := NewHostAddrs(netip.MustParseAddr("::ffff:1.2.3.4"), netip.MustParseAddr("fe80::1%eth0"))
	h.OnChange(func(a []netip.Addr) { seen = append(seen, a) })
	if !h.Contains(netip.MustParseAddr("1.2.3.4")) || !h.Contains(netip.MustParseAddr("fe80::1")) || h.Contains(netip.MustParseAddr("1.2.3.5")) {
		t.Fatalf("set %v", h.Addrs())
	}
	g := h.generation()
	h.Add(netip.MustParseAddr("1.2.3.4")) // no change
	h.Set([]netip.Addr{netip.MustParseAddr("fe80::1"), netip.MustParseAddr("1.2.3.4")})
	if h.generation() != g || len(seen) != 0 {
		t.Fatal("a no-op changed the set")
	}
	h.Remove(netip.MustParseAddr("1.2.3.4"))
	if h.Contains(netip.MustParseAddr("1.2.3.4")) || h.generation() == g || len(seen) != 1 || len(seen[0]) != 1 {
		t.Fatalf("after Remove: %v, %v", h.Addrs(), seen)
	}
	var nilSet *HostAddrs
	if nilSet.Contains(netip.MustParseAddr("1.2.3.4")) || nilSet.Addrs() != nil {
		t.Fatal("nil set holds something")
	}
}
