package dnsresolver

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// FuzzCanonicalName: no panic; an accepted name is canonical (idempotent,
// lower-case LDH, within the limits), is a valid wire name, and the input
// held none of the refused bytes.
func FuzzCanonicalName(f *testing.F) {
	for _, s := range []string{
		"example.com", "Example.COM.", "a.b.c", "xn--bcher-kva.example", "localhost",
		"", ".", "..", "a..b", "exa\x00mple.com", "example.com\x00.evil", "a\r\nb.com", "a\tb.com",
		"%2e.com", `a\000b.com`, `a\.b.com`, "a b.com", "a_b.com", "*.example.com", "exämple.com",
		"-a.com", "a-.com", strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 127) + "b",
		"1.2.3.4", "0x7f.1", "example.com..", "\x7f", "A.B.C.",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := CanonicalName(in)
		if err != nil {
			return
		}
		if strings.ContainsAny(in, "\x00\r\n%\\") {
			t.Fatalf("accepted %q with a refused byte", in)
		}
		if again, err := CanonicalName(out); err != nil || again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, out, again, err)
		}
		if out == "" || len(out) > MaxNameLen || strings.HasSuffix(out, ".") || strings.HasPrefix(out, ".") {
			t.Fatalf("bad shape %q", out)
		}
		for i := 0; i < len(out); i++ {
			c := out[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
				t.Fatalf("%q: byte %q", out, c)
			}
		}
		if !strings.EqualFold(strings.TrimSuffix(in, "."), out) {
			t.Fatalf("%q canonicalised to a different name %q", in, out)
		}
		if _, ok := dns.IsDomainName(out + "."); !ok {
			t.Fatalf("%q is not a valid domain name for miekg/dns", out)
		}
		m := new(dns.Msg)
		m.SetQuestion(out+".", dns.TypeA)
		if _, err := m.Pack(); err != nil {
			t.Fatalf("%q does not pack: %v", out, err)
		}
	})
}

// FuzzPattern: no panic; the indexed policy agrees with Pattern.Match, and
// a match is always the base or a subdomain of it.
func FuzzPattern(f *testing.F) {
	for _, s := range [][2]string{
		{"example.com", "example.com"}, {"*.example.com", "a.example.com"}, {"**.example.com", "example.com"},
		{"*.example.com", "example.com"}, {"**.example.com", "aexample.com"}, {"*", "a.com"}, {"*.com", "a.com"},
		{"a*.b.com", "ax.b.com"}, {"**.b.com", "x.y.b.com"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pat, name string) {
		p, err := ParsePattern(pat)
		if err != nil {
			return
		}
		if p.Base == "" || strings.Contains(p.Base, "*") {
			t.Fatalf("%q parsed to %+v", pat, p)
		}
		n, err := CanonicalName(name)
		if err != nil {
			return
		}
		c, err := compilePolicy(Policy{Grants: []Grant{{Pattern: pat, Handle: h1}}, Deny: []string{pat}})
		if err != nil {
			t.Fatal(err)
		}
		m := p.Match(n)
		if m != (len(c.grants(n)) == 1) || m != c.denied(n) {
			t.Fatalf("%v vs %q: Match %v, grants %d, denied %v", p, n, m, len(c.grants(n)), c.denied(n))
		}
		if m && n != p.Base && !strings.HasSuffix(n, "."+p.Base) {
			t.Fatalf("%v matched unrelated %q", p, n)
		}
		if m && p.Kind == Subdomains && n == p.Base {
			t.Fatalf("%v matched its apex", p)
		}
	})
}

// fuzzExchanger answers from the test zone, or, when the fuzzer supplied a
// parsable upstream message, with that (ID and question fixed up to match),
// and logs every name asked.
type fuzzExchanger struct {
	zone  *fakeUpstream
	reply []byte
	mu    sync.Mutex
	asked []string
}

func (x *fuzzExchanger) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	x.mu.Lock()
	x.asked = append(x.asked, q.Question[0].Name)
	x.mu.Unlock()
	m := new(dns.Msg)
	if len(x.reply) > 0 && m.Unpack(x.reply) == nil {
		m.Id, m.Response, m.Question = q.Id, true, q.Question
		return m, checkReply(q, m)
	}
	return memExchanger{x.zone}.exchange(ctx, q)
}

// fuzzHostAddrs are the host's addresses in the fuzz tests: one a zone
// name resolves to, one a seed's upstream reply carries (under a grant
// allowing 10.0.0.0/8, which does not name it).
var fuzzHostAddrs = []netip.Addr{netip.MustParseAddr("93.184.216.36"), netip.MustParseAddr("10.9.9.9")}

var fuzzPolicy = Policy{
	Grants: append(testPolicy.Grants,
		Grant{Pattern: "**.fuzz.test", Handle: h2, AllowNonPublic: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8")}}),
	Deny: []string{"**.evil.test", "bad.fuzz.test"},
}

// FuzzHandle feeds arbitrary query bytes (and optionally arbitrary upstream
// reply bytes) through the handler. Invariants: no panic; nothing is asked
// upstream for a name the session may not resolve; no entry is written for a
// refused query; every entry is for session s1, carries a handle of a grant
// matching the question name, and a public address or one its grant allows,
// never one of the host's own unless the grant names it.
func FuzzHandle(f *testing.F) {
	seed := func(name string, qtype uint16, edns bool) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		if edns {
			m.SetEdns0(4096, true)
		}
		b, _ := m.Pack()
		return b
	}
	upA := func(owner, target, addr string) []byte {
		m := new(dns.Msg)
		m.Response = true
		if target != "" {
			m.Answer = append(m.Answer, mustRR(owner+" 60 IN CNAME "+target))
			owner = target
		}
		m.Answer = append(m.Answer, mustRR(owner+" 0 IN A "+addr))
		b, _ := m.Pack()
		return b
	}
	for _, s := range []struct {
		q  []byte
		up []byte
	}{
		{seed("allowed.test.", dns.TypeA, false), nil},
		{seed("www.chain.test.", dns.TypeAAAA, true), nil},
		{seed("rebind.test.", dns.TypeA, false), nil},
		{seed("notallowed.test.", dns.TypeA, false), nil},
		{seed("blocked.evil.test.", dns.TypeA, false), nil},
		{seed(`x\000.allowed.test.`, dns.TypeA, false), nil},
		{seed("allowed.test.", dns.TypeANY, false), nil},
		{seed("a.fuzz.test.", dns.TypeA, false), upA("a.fuzz.test.", "", "10.9.9.9")},
		{seed("a.fuzz.test.", dns.TypeA, false), upA("a.fuzz.test.", "bad.fuzz.test.", "8.8.8.8")},
		{seed("a.fuzz.test.", dns.TypeA, false), upA("a.fuzz.test.", "x.evil.test.", "8.8.4.4")},
		{seed("a.fuzz.test.", dns.TypeA, false), upA("other.test.", "", "9.9.9.9")},
		{seed("a.fuzz.test.", dns.TypeA, false), upA("a.fuzz.test.", "", "169.254.169.254")},
		{seed("a.fuzz.test.", dns.TypeA, false), upA("a.fuzz.test.", "", "127.128.0.2")},
		{[]byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c}, nil},
		{[]byte{}, nil},
	} {
		f.Add(s.q, s.up, uint8(1))
	}
	zone := loadZone(f, testZone)
	f.Fuzz(func(t *testing.T, q, up []byte, idx uint8) {
		dp := newFakeDataplane()
		dp.sessions[1] = "s1"
		dp.sessions[2] = "s2"
		now := time.Unix(1_800_000_000, 0)
		r, err := New(Config{
			Dataplane:   dp,
			SessionName: dp.SessionByIndex,
			Upstreams:   []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
			Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
			CacheSize:   -1,
			HostAddrs:   NewHostAddrs(fuzzHostAddrs...),
			now:         func() time.Time { return now },
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.SetPolicy("s1", fuzzPolicy); err != nil {
			t.Fatal(err)
		}
		x := &fuzzExchanger{zone: zone, reply: up}
		r.up = x
		local := SessionAddr(uint32(idx % 4)) // 0: not a session; 3: unknown
		if idx%4 == 0 {
			local = netip.MustParseAddr("127.0.0.1")
		}
		out := r.handleRaw(local, "udp", q)

		pol := r.policy("s1")
		for _, a := range x.asked {
			n, err := CanonicalName(a)
			if err != nil || idx%4 != 1 || pol.denied(n) || len(pol.grants(n)) == 0 {
				t.Fatalf("%q asked upstream for session index %d", a, idx%4)
			}
		}
		entries := dp.take()
		resp := new(dns.Msg)
		if out != nil {
			if err := resp.Unpack(out); err != nil {
				t.Fatalf("reply does not unpack: %v", err)
			}
		}
		if len(entries) == 0 {
			return
		}
		if out == nil || resp.Rcode != dns.RcodeSuccess {
			t.Fatalf("%d entries written for a reply with rcode %d", len(entries), resp.Rcode)
		}
		qname, err := CanonicalName(resp.Question[0].Name)
		if err != nil {
			t.Fatalf("entries for invalid name %q", resp.Question[0].Name)
		}
		grants := pol.grants(qname)
		for _, e := range entries {
			if e.Session != "s1" {
				t.Fatalf("entry for session %q", e.Session)
			}
			if SessionPrefix.Contains(e.Rule.Prefix.Addr()) {
				t.Fatalf("entry %v for a session resolver address", e.Rule)
			}
			ok := false
			for _, g := range grants {
				a := e.Rule.Prefix.Addr()
				if g.Handle == e.Rule.Handle && g.allows(a) && (!r.host.Contains(a) || g.namesHost(a)) {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("entry %v not justified by a grant for %q", e.Rule, qname)
			}
			if e.Rule.Expires.Before(now.Add(r.cfg.MinTTL)) || e.Rule.Expires.After(now.Add(r.cfg.MaxTTL)) {
				t.Fatalf("entry %v expiry outside the clamp", e.Rule)
			}
		}
	})
}
