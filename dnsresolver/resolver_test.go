package dnsresolver

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
)

// wantEntry is one expected AllowEgress call for session s1.
type wantEntry struct {
	prefix string
	handle dataplane.HandleRef
	proto  dataplane.Proto
	ports  dataplane.PortRange
	ttl    time.Duration
}

const noDenial = Reason(255)

func TestResolve(t *testing.T) {
	tcp443 := func(p string, ttl time.Duration) wantEntry {
		return wantEntry{p, h1, dataplane.ProtoTCP, dataplane.Port(443), ttl}
	}
	any := func(p string, h dataplane.HandleRef, ttl time.Duration) wantEntry {
		return wantEntry{p, h, dataplane.ProtoAny, dataplane.AnyPort, ttl}
	}
	cases := []struct {
		name     string
		index    uint32
		qname    string
		qtype    uint16
		rcode    int
		answer   []string // addresses and "cname:target", in order
		entries  []wantEntry
		denial   Reason
		upstream bool // whether the name may reach the upstream
	}{
		{name: "exact A", qname: "allowed.test.", qtype: dns.TypeA, answer: []string{"93.184.216.34"},
			entries: []wantEntry{tcp443("93.184.216.34/32", 300*time.Second)}, upstream: true},
		{name: "exact AAAA", qname: "allowed.test.", qtype: dns.TypeAAAA, answer: []string{"2606:2800:220:1::1"},
			entries: []wantEntry{tcp443("2606:2800:220:1::1/128", 300*time.Second)}, upstream: true},
		{name: "mixed case", qname: "ALLOWED.Test.", qtype: dns.TypeA, answer: []string{"93.184.216.34"},
			entries: []wantEntry{tcp443("93.184.216.34/32", 300*time.Second)}, upstream: true},
		{name: "subdomain wildcard", qname: "api.allowed.test.", qtype: dns.TypeA, answer: []string{"93.184.216.35"},
			entries: []wantEntry{any("93.184.216.35/32", h2, 120*time.Second)}, upstream: true},
		{name: "deep subdomain", qname: "deep.api.allowed.test.", qtype: dns.TypeA, answer: []string{"93.184.216.36"},
			entries: []wantEntry{any("93.184.216.36/32", h2, 120*time.Second)}, upstream: true},
		{name: "CNAME chain A", qname: "www.chain.test.", qtype: dns.TypeA,
			answer:  []string{"cname:edge.cdn.test", "cname:e1.provider.test", "198.41.0.4"},
			entries: []wantEntry{tcp443("198.41.0.4/32", 20*time.Second)}, upstream: true},
		{name: "CNAME chain AAAA", qname: "www.chain.test.", qtype: dns.TypeAAAA,
			answer:  []string{"cname:edge.cdn.test", "cname:e1.provider.test", "2001:503:ba3e::2:30"},
			entries: []wantEntry{tcp443("2001:503:ba3e::2:30/128", 20*time.Second)}, upstream: true},
		{name: "rebinding A stripped", qname: "rebind.test.", qtype: dns.TypeA, answer: []string{"8.8.8.8"},
			entries: []wantEntry{any("8.8.8.8/32", h1, 300*time.Second)}, upstream: true},
		{name: "rebinding AAAA stripped", qname: "rebind.test.", qtype: dns.TypeAAAA, answer: []string{"2a00:1450:4001::1"},
			entries: []wantEntry{any("2a00:1450:4001::1/128", h1, 300*time.Second)}, upstream: true},
		{name: "non-public allowed by grant", qname: "internal.corp.test.", qtype: dns.TypeA, answer: []string{"10.1.2.3"},
			entries: []wantEntry{any("10.1.2.3/32", h3, 300*time.Second)}, upstream: true},
		{name: "TTL 0 clamped up", qname: "short.test.", qtype: dns.TypeA, answer: []string{"1.1.1.1"},
			entries: []wantEntry{any("1.1.1.1/32", h1, 5*time.Second)}, upstream: true},
		{name: "TTL 1d clamped down", qname: "long.test.", qtype: dns.TypeA, answer: []string{"1.0.0.1"},
			entries: []wantEntry{any("1.0.0.1/32", h1, time.Hour)}, upstream: true},
		{name: "NXDOMAIN passes", qname: "nx.allowed.test.", qtype: dns.TypeA, rcode: dns.RcodeNameError, upstream: true},
		{name: "NODATA passes", qname: "nodata.test.", qtype: dns.TypeA, upstream: true},
		{name: "not allowed", qname: "notallowed.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonNotAllowed},
		{name: "apex not in *.", qname: "evil2.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonNotAllowed},
		{name: "deny overrides grant", qname: "blocked.evil.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonDenied},
		{name: "deny apex", qname: "evil.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonDenied},
		{name: "CNAME to denied name", qname: "alias.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonCNAMEDenied, upstream: true},
		{name: "CNAME to invalid name", qname: "badtarget.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonCNAMEDenied, upstream: true},
		{name: "CNAME loop", qname: "loop.test.", qtype: dns.TypeA, rcode: dns.RcodeServerFailure, upstream: true},
		{name: "CNAME chain too long", qname: "c0.longchain.test.", qtype: dns.TypeA, rcode: dns.RcodeServerFailure, upstream: true},
		{name: "ANY refused", qname: "allowed.test.", qtype: dns.TypeANY, rcode: dns.RcodeRefused, denial: ReasonQType},
		{name: "TXT refused by default", qname: "api.allowed.test.", qtype: dns.TypeTXT, rcode: dns.RcodeRefused, denial: ReasonQType},
		{name: "PTR refused", qname: "4.3.2.1.in-addr.arpa.", qtype: dns.TypePTR, rcode: dns.RcodeRefused, denial: ReasonNotAllowed},
		{name: "HTTPS empty locally", qname: "api.allowed.test.", qtype: dns.TypeHTTPS},
		{name: "NUL in name", qname: `allowed.test\000.evil.com.`, qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonInvalidName},
		{name: "NUL prefix", qname: `x\000.allowed.test.`, qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonInvalidName},
		{name: "LF in name", qname: `x\010y.allowed.test.`, qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonInvalidName},
		{name: "dot in label", qname: `evil\.allowed.test.`, qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonInvalidName},
		{name: "percent", qname: "%41.allowed.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonInvalidName},
		{name: "underscore", qname: "a_b.allowed.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonInvalidName},
		{name: "high byte", qname: `x\200.allowed.test.`, qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonInvalidName},
		{name: "exfil label", qname: "c2VjcmV0LXRva2Vu.attacker.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonNotAllowed},
		{name: "session without policy", index: 300, qname: "allowed.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonNotAllowed},
		{name: "unknown session", index: 77, qname: "allowed.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused, denial: ReasonUnknownSession},
	}
	for _, transport := range []string{"udp", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			// Every case checks its own writes, so no write is skipped.
			e := newTestEnv(t, func(c *Config) { c.AlwaysWrite = true })
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					if tc.index == 0 {
						tc.index = 1
					}
					if tc.rcode != dns.RcodeRefused {
						tc.denial = noDenial
					}
					asked := e.up.queries()
					before := time.Now()
					resp := e.ask(t, tc.index, transport, tc.qname, tc.qtype)
					after := time.Now()
					if resp.Rcode != tc.rcode {
						t.Fatalf("rcode %s, want %s", dns.RcodeToString[resp.Rcode], dns.RcodeToString[tc.rcode])
					}
					if got := answerAddrs(resp); !slices.Equal(got, tc.answer) {
						t.Errorf("answer %v, want %v", got, tc.answer)
					}
					if len(resp.Answer) > 0 && resp.Answer[0].Header().Name != tc.qname {
						t.Errorf("answer owner %q, want the question's %q", resp.Answer[0].Header().Name, tc.qname)
					}
					got := e.dp.take()
					checkEntries(t, got, tc.entries, before, after)
					// No answer outlives its kernel entry in a client's cache.
					for _, rr := range resp.Answer {
						for _, g := range got {
							if a := answerAddrs(&dns.Msg{Answer: []dns.RR{rr}}); len(a) == 1 && g.Rule.Prefix.Addr().String() == a[0] &&
								before.Add(time.Duration(rr.Header().Ttl)*time.Second).After(g.Rule.Expires) {
								t.Errorf("%s: TTL %d outlives the entry (expires %v)", a[0], rr.Header().Ttl, g.Rule.Expires)
							}
						}
					}
					den := e.den.take()
					if tc.denial == noDenial {
						if len(den) != 0 {
							t.Errorf("denials %+v, want none", den)
						}
					} else {
						if len(den) != 1 || den[0].Reason != tc.denial || den[0].Transport != transport || den[0].Index != tc.index {
							t.Fatalf("denials %+v, want one %v", den, tc.denial)
						}
						if tc.index == 1 && den[0].Session != "s1" {
							t.Errorf("denial session %q", den[0].Session)
						}
					}
					if !tc.upstream && e.up.queries() != asked {
						t.Errorf("%s reached the upstream", tc.qname)
					}
				})
			}
			// Names refused for s1 never reached the upstream, at any time.
			for _, tc := range cases {
				if tc.index <= 1 && (tc.denial == ReasonNotAllowed || tc.denial == ReasonDenied || tc.denial == ReasonInvalidName) && e.up.askedFor(tc.qname) {
					t.Errorf("refused name %s reached the upstream", tc.qname)
				}
			}
			st := e.r.Stats()
			if st.Total.Queries != uint64(len(cases)) || st.Sessions["s1"].Queries == 0 {
				t.Errorf("stats %+v", st)
			}
			if st.Sessions["s1"].Denials[ReasonInvalidName] != 7 || st.Total.Denials[ReasonUnknownSession] != 1 {
				t.Errorf("denial counters %+v", st.Total.Denials)
			}
			if _, ok := st.Sessions[""]; ok {
				t.Error("counters for the empty session")
			}
		})
	}
}

func checkEntries(t *testing.T, got []entry, want []wantEntry, before, after time.Time) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for i, w := range want {
		g := got[i]
		r := g.Rule
		if g.Session != "s1" || r.Prefix.String() != w.prefix || r.Handle != w.handle || r.Proto != w.proto || r.Ports != w.ports {
			t.Errorf("entry %d = %s %v, want %+v", i, g.Session, r, w)
		}
		if lo, hi := before.Add(w.ttl-time.Second), after.Add(w.ttl+time.Second); r.Expires.Before(lo) || r.Expires.After(hi) {
			t.Errorf("entry %d expires %v, want now+%v (%v..%v)", i, r.Expires, w.ttl, lo, hi)
		}
	}
}

// TestMultipleGrants: a name matched by two grants gets one entry per grant.
func TestMultipleGrants(t *testing.T) {
	e := newTestEnv(t, nil)
	if err := e.r.SetPolicy("s1", Policy{Grants: []Grant{
		{Pattern: "**.allowed.test", Handle: h1, Proto: dataplane.ProtoTCP, Ports: dataplane.Port(443)},
		{Pattern: "api.allowed.test", Handle: h2, Proto: dataplane.ProtoUDP, Ports: dataplane.PortRange{Lo: 1000, Hi: 2000}},
	}}); err != nil {
		t.Fatal(err)
	}
	e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
	got := e.dp.take()
	if len(got) != 2 || got[0].Rule.Handle == got[1].Rule.Handle {
		t.Fatalf("entries %v", got)
	}
	// Removing the policy refuses the session's queries.
	e.r.RemovePolicy("s1")
	if resp := e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("after RemovePolicy: %v", resp)
	}
}

func TestDenyRcodeNXDOMAIN(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.DenyRcode = dns.RcodeNameError })
	if resp := e.ask(t, 1, "udp", "notallowed.test.", dns.TypeA); resp.Rcode != dns.RcodeNameError {
		t.Fatalf("got %v", resp)
	}
}

func TestPassthroughTXT(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.PassthroughTypes = []uint16{dns.TypeTXT} })
	resp := e.ask(t, 1, "udp", "allowed.test.", dns.TypeTXT)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.TXT).Txt[0] != "hello" {
		t.Fatalf("got %v", resp)
	}
	if got := e.dp.take(); len(got) != 0 {
		t.Fatalf("TXT wrote entries: %v", got)
	}
	if resp := e.ask(t, 1, "udp", "notallowed.test.", dns.TypeTXT); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("got %v", resp)
	}
}

// TestTruncation: a big answer (within MaxAnswerRecords) is truncated over
// UDP (TC set) and complete over TCP; the resolver itself falls back to TCP
// upstream. All entries are written before either answer.
func TestTruncation(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MaxAnswerRecords = 100 })
	u := e.ask(t, 1, "udp", "many.test.", dns.TypeA)
	if !u.Truncated || u.Rcode != dns.RcodeSuccess {
		t.Fatalf("udp: TC=%v rcode %d", u.Truncated, u.Rcode)
	}
	if got := e.dp.take(); len(got) != 100 {
		t.Fatalf("%d entries, want 100", len(got))
	}
	c := e.ask(t, 1, "tcp", "many.test.", dns.TypeA)
	if c.Truncated || len(c.Answer) != 100 {
		t.Fatalf("tcp: TC=%v, %d answers", c.Truncated, len(c.Answer))
	}
}

// TestSharedAddressKeepsLongerExpiry: two names on one address with
// different TTLs; the later, shorter answer does not shorten the entry.
func TestSharedAddressKeepsLongerExpiry(t *testing.T) {
	e := newTestEnv(t, nil)
	up := startFakeUpstream(t, []string{"a.cdn.test. 300 IN A 93.184.216.40", "b.cdn.test. 20 IN A 93.184.216.40"})
	r2, err := New(Config{Dataplane: e.dp, SessionName: e.dp.SessionByIndex, ListenAddr: netip.MustParseAddrPort("0.0.0.0:0"),
		Upstreams: []netip.AddrPort{up.addr}, Logger: e.r.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r2.Close() })
	if err := r2.SetPolicy("s1", Policy{Grants: []Grant{{Pattern: "**.cdn.test", Handle: h1}}}); err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("a.cdn.test.", dns.TypeA)
	qa, _ := m.Pack()
	m.SetQuestion("b.cdn.test.", dns.TypeA)
	qb, _ := m.Pack()
	if out := r2.handleRaw(SessionAddr(1), "udp", qa); out == nil {
		t.Fatal("no answer")
	}
	if out := r2.handleRaw(SessionAddr(1), "udp", qb); out == nil {
		t.Fatal("no answer")
	}
	got := e.dp.take()
	if len(got) != 1 || time.Until(got[0].Rule.Expires) < 250*time.Second {
		t.Fatalf("entries %v: want one, expiring in about 300s", got)
	}
	if st := r2.Stats(); st.Total.WritesSkipped != 1 {
		t.Fatalf("stats %+v", st.Total)
	}
}
