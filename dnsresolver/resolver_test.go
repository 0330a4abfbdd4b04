package dnsresolver

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
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

// TestReplySource checks, with an unconnected socket, that the UDP reply
// comes from the session address the query was sent to, for several
// sessions, and that the TCP conn is identified by its local address.
func TestReplySource(t *testing.T) {
	e := newTestEnv(t, nil)
	for i := uint32(2); i < 1000; i += 97 {
		e.dp.setSession(i, fmt.Sprintf("s%d", i))
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for _, idx := range []uint32{1, 2, 99, 300, 77, 970} {
		t.Run(SessionAddr(idx).String(), func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("allowed.test.", dns.TypeA)
			out, _ := m.Pack()
			to := netip.AddrPortFrom(SessionAddr(idx), e.r.Port())
			if _, err := c.WriteToUDPAddrPort(out, to); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 4096)
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatal(err)
			}
			if from != to {
				t.Fatalf("reply from %v, want %v", from, to)
			}
			resp := new(dns.Msg)
			if err := resp.Unpack(buf[:n]); err != nil || resp.Id != m.Id {
				t.Fatalf("reply %v %v", resp, err)
			}
			want := dns.RcodeRefused
			if idx == 1 {
				want = dns.RcodeSuccess
			}
			if resp.Rcode != want {
				t.Fatalf("rcode %s, want %s", dns.RcodeToString[resp.Rcode], dns.RcodeToString[want])
			}
		})
	}
	// Denials name the session the address belongs to, never another.
	for _, d := range e.den.take() {
		if want, _ := e.dp.SessionByIndex(d.Index); d.Session != want {
			t.Errorf("denial %+v attributed to %q, want %q", d, d.Session, want)
		}
	}
}

// TestNotASessionAddress sends to loopback addresses outside 127.128.0.0/9.
func TestNotASessionAddress(t *testing.T) {
	e := newTestEnv(t, nil)
	for _, a := range []string{"127.0.0.1", "127.127.255.255", "127.128.0.0"} {
		t.Run(a, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("allowed.test.", dns.TypeA)
			for _, tr := range []string{"udp", "tcp"} {
				resp := e.exchange(t, netip.AddrPortFrom(netip.MustParseAddr(a), e.r.Port()), tr, m)
				if resp.Rcode != dns.RcodeRefused {
					t.Fatalf("%s: rcode %s", tr, dns.RcodeToString[resp.Rcode])
				}
			}
			den := e.den.take()
			if len(den) != 2 || den[0].Reason != ReasonUnknownSession || den[0].Session != "" {
				t.Fatalf("denials %+v", den)
			}
		})
	}
	if e.up.queries() != 0 || len(e.dp.take()) != 0 {
		t.Fatal("a query from no session reached the upstream or wrote entries")
	}
}

func TestUpstreamFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(e *testEnv)
	}{
		{"down", func(e *testEnv) { e.up.stop() }},
		{"servfail", func(e *testEnv) { e.up.setRcode(dns.RcodeServerFailure) }},
		{"refused", func(e *testEnv) { e.up.setRcode(dns.RcodeRefused) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, func(c *Config) { c.UpstreamTimeout = 300 * time.Millisecond })
			tc.setup(e)
			for _, tr := range []string{"udp", "tcp"} {
				resp := e.ask(t, 1, tr, "allowed.test.", dns.TypeA)
				if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
					t.Fatalf("%s: %v", tr, resp)
				}
			}
			if got := e.dp.take(); len(got) != 0 {
				t.Fatalf("entries written: %v", got)
			}
			if st := e.r.Stats(); st.Sessions["s1"].ServFail != 2 {
				t.Fatalf("servfail counter %+v", st.Sessions["s1"])
			}
		})
	}
}

// TestWriteFailure: when the kernel write fails, the answer is withheld.
func TestWriteFailure(t *testing.T) {
	e := newTestEnv(t, nil)
	e.dp.setFail(fmt.Errorf("%w: injected", dataplane.ErrHandleNotLive))
	resp := e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("got %v", resp)
	}
	// A cached answer is not released either.
	resp = e.ask(t, 1, "tcp", "allowed.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("got %v", resp)
	}
	if st := e.r.Stats(); st.Total.WriteErrors != 2 || st.Total.EntriesWritten != 0 {
		t.Fatalf("stats %+v", st.Total)
	}
	e.dp.setFail(nil)
	if resp := e.ask(t, 1, "udp", "allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("after recovery: %v", resp)
	}
}

// TestCacheRewritesEntries: with AlwaysWrite, a cached answer still writes
// its entry (with the original expiry) before it is returned, and does not
// ask the upstream again.
func TestCacheRewritesEntries(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.AlwaysWrite = true })
	first := e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
	n := e.up.queries()
	e1 := e.dp.take()
	time.Sleep(1100 * time.Millisecond)
	second := e.ask(t, 1, "tcp", "api.allowed.test.", dns.TypeA)
	e2 := e.dp.take()
	if e.up.queries() != n {
		t.Fatal("cache miss")
	}
	if len(e1) != 1 || len(e2) != 1 || !e1[0].Rule.Expires.Equal(e2[0].Rule.Expires) {
		t.Fatalf("entries %v then %v", e1, e2)
	}
	if t1, t2 := first.Answer[0].Header().Ttl, second.Answer[0].Header().Ttl; t2 >= t1 {
		t.Fatalf("cached TTL %d not below first TTL %d", t2, t1)
	}
	if e.r.Stats().Sessions["s1"].CacheHits != 1 {
		t.Fatal("cache hit not counted")
	}
}

// TestWriteMemo: by default a cached answer whose entry this resolver
// already wrote (same rule, same expiry) skips the write; a new policy, a
// different grant or another session writes again.
func TestWriteMemo(t *testing.T) {
	e := newTestEnv(t, nil)
	e.dp.setSession(2, "s2")
	if err := e.r.SetPolicy("s2", testPolicy); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		do     func()
		writes int
	}{
		{"first answer writes", func() { e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA) }, 1},
		{"cached answer skips", func() { e.ask(t, 1, "tcp", "api.allowed.test.", dns.TypeA) }, 0},
		{"mixed case is the same name", func() { e.ask(t, 1, "udp", "API.allowed.TEST.", dns.TypeA) }, 0},
		{"other session writes", func() { e.ask(t, 2, "udp", "api.allowed.test.", dns.TypeA) }, 1},
		{"SetPolicy forgets", func() {
			if err := e.r.SetPolicy("s1", testPolicy); err != nil {
				t.Fatal(err)
			}
			e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
		}, 1},
		{"s2 still remembered", func() { e.ask(t, 2, "udp", "api.allowed.test.", dns.TypeA) }, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.do()
			if got := e.dp.take(); len(got) != s.writes {
				t.Fatalf("%d writes, want %d: %v", len(got), s.writes, got)
			}
		})
	}
	if st := e.r.Stats(); st.Total.WritesSkipped != 3 || st.Total.EntriesWritten != 3 {
		t.Fatalf("stats %+v", st.Total)
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

// TestTruncation: a big answer is truncated over UDP (TC set) and complete
// over TCP; the resolver itself falls back to TCP upstream. All entries are
// written before either answer.
func TestTruncation(t *testing.T) {
	e := newTestEnv(t, nil)
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

// TestUpstreamQueryIsFresh: nothing of the client's message but the name and
// type reaches the upstream (no EDNS options that could carry data).
func TestUpstreamQueryIsFresh(t *testing.T) {
	e := newTestEnv(t, nil)
	m := new(dns.Msg)
	m.SetQuestion("API.allowed.test.", dns.TypeA)
	m.SetEdns0(4096, true)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte("secret-data")},
		&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(1, 2, 3, 0)})
	m.Extra = append(m.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{"secret"}})
	resp := e.exchange(t, netip.AddrPortFrom(SessionAddr(1), e.r.Port()), "udp", m)
	if resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("%v", resp)
	}
	if o := resp.IsEdns0(); o == nil || len(o.Option) != 0 {
		t.Fatalf("reply OPT %v", o)
	}
	e.up.mu.Lock()
	defer e.up.mu.Unlock()
	if len(e.up.msgs) != 1 {
		t.Fatalf("%d upstream queries", len(e.up.msgs))
	}
	up := e.up.msgs[0]
	if up.Id == m.Id && up.Id != 0 {
		t.Log("upstream ID equals client ID (chance 1/65536)")
	}
	if up.Question[0].Name != "api.allowed.test." || len(up.Extra) != 1 || len(up.IsEdns0().Option) != 0 || up.IsEdns0().Do() {
		t.Fatalf("upstream query carries client data: %v", up)
	}
	if strings.Contains(up.String(), "secret") {
		t.Fatal("secret forwarded")
	}
}

func TestMalformed(t *testing.T) {
	e := newTestEnv(t, nil)
	to := netip.AddrPortFrom(SessionAddr(1), e.r.Port())
	for _, tc := range []struct {
		name  string
		msg   func() *dns.Msg
		rcode int
	}{
		{"two questions", func() *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion("allowed.test.", dns.TypeA)
			m.Question = append(m.Question, dns.Question{Name: "notallowed.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
			return m
		}, dns.RcodeFormatError},
		{"no question", func() *dns.Msg { m := new(dns.Msg); m.Id = 7; return m }, dns.RcodeFormatError},
		{"class CH", func() *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion("allowed.test.", dns.TypeA)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		}, dns.RcodeFormatError},
		{"notify", func() *dns.Msg {
			m := new(dns.Msg)
			m.SetNotify("allowed.test.")
			return m
		}, dns.RcodeNotImplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.exchange(t, to, "tcp", tc.msg())
			if resp.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s", dns.RcodeToString[resp.Rcode], dns.RcodeToString[tc.rcode])
			}
		})
	}
	if e.up.queries() != 0 {
		t.Fatal("malformed query forwarded")
	}
	// Garbage over UDP gets FORMERR (header present) or nothing.
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.Write([]byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xff})
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil || n < 12 || buf[0] != 0x12 || buf[1] != 0x34 || buf[3]&0xf != dns.RcodeFormatError {
		t.Fatalf("garbage: %x %v", buf[:n], err)
	}
}

func TestConfigValidate(t *testing.T) {
	dp := newFakeDataplane()
	up := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up}, true},
		{"no dataplane", Config{Upstreams: up, SessionName: dp.SessionByIndex}, false},
		{"no SessionName", Config{Dataplane: dp, Upstreams: up}, false},
		{"listen on loopback", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, ListenAddr: netip.MustParseAddrPort("127.0.0.1:53")}, false},
		{"listen v6", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, ListenAddr: netip.MustParseAddrPort("[::]:53")}, false},
		{"upstream port 0", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: []netip.AddrPort{netip.MustParseAddrPort("1.1.1.1:0")}}, false},
		{"upstream is a session", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.128.0.1:53")}}, false},
		{"min > max", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, MinTTL: time.Hour, MaxTTL: time.Minute}, false},
		{"min < 1s", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, MinTTL: time.Millisecond}, false},
		{"rcode servfail", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, DenyRcode: dns.RcodeServerFailure}, false},
		{"nxdomain", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, DenyRcode: dns.RcodeNameError}, true},
		{"passthrough ANY", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, PassthroughTypes: []uint16{dns.TypeANY}}, false},
		{"passthrough HTTPS", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, PassthroughTypes: []uint16{dns.TypeHTTPS}}, false},
		{"passthrough MX", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, PassthroughTypes: []uint16{dns.TypeMX}}, true},
		{"chain 100", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, MaxCNAMEChain: 100}, false},
		{"busy poll off", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, UDPBusyPoll: -1}, true},
		{"busy poll 2ms", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, UDPBusyPoll: 2 * time.Millisecond}, false},
		{"bad resolv.conf", Config{Dataplane: dp, SessionName: dp.SessionByIndex, ResolvConf: "/nonexistent"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.cfg)
			if tc.ok != (err == nil) {
				t.Fatalf("New: %v", err)
			}
			if err == nil {
				r.Close()
			}
		})
	}
}

func TestResolvConfDefault(t *testing.T) {
	f := t.TempDir() + "/resolv.conf"
	if err := writeFile(f, "# test\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 127.128.0.5\noptions edns0\n"); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Dataplane: newFakeDataplane(), SessionName: newFakeDataplane().SessionByIndex, ResolvConf: f})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	got := r.Upstreams()
	want := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.53:53"), netip.MustParseAddrPort("[::1]:53")}
	if !slices.Equal(got, want) {
		t.Fatalf("upstreams %v, want %v", got, want)
	}
}

func TestStartClose(t *testing.T) {
	e := newTestEnv(t, nil)
	if err := e.r.Start(); err == nil {
		t.Fatal("second Start succeeded")
	}
	port := e.r.Port()
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Start(); err == nil {
		t.Fatal("Start after Close succeeded")
	}
	// Nothing listens any more: the query fails, it is not answered.
	c := &dns.Client{Net: "tcp", Timeout: time.Second}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	if _, _, err := c.Exchange(m, netip.AddrPortFrom(SessionAddr(1), port).String()); err == nil {
		t.Fatal("answered after Close")
	}
}

func TestWriteMetrics(t *testing.T) {
	e := newTestEnv(t, nil)
	e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)
	e.ask(t, 1, "udp", "notallowed.test.", dns.TypeA)
	e.ask(t, 77, "udp", "allowed.test.", dns.TypeA)
	var b strings.Builder
	if err := e.r.WriteMetrics(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		`shinken_dns_queries_total{session="s1"} 2`,
		`shinken_dns_queries_total{session=""} 1`,
		`shinken_dns_refused_total{session="s1",reason="not_allowed"} 1`,
		`shinken_dns_refused_total{session="",reason="unknown_session"} 1`,
		`shinken_dns_entries_written_total{session="s1"} 1`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "notallowed") {
		t.Error("a query name leaked into the metrics")
	}
}

// TestNoReflection: a UDP query that reached the socket on one of the host's
// real (non-loopback) addresses is counted and reported, never answered.
// In-process: no packet is sent to such an address.
func TestNoReflection(t *testing.T) {
	e := newTestEnv(t, nil)
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	q, _ := m.Pack()
	for _, a := range []string{"10.0.0.1", "192.0.2.1", "203.0.113.9"} {
		local := netip.MustParseAddr(a)
		if out := e.r.handleRaw(local, "udp", q); out != nil {
			t.Errorf("%s: answered over UDP", a)
		}
		if out := e.r.handleRaw(local, "udp", q[:14]); out != nil {
			t.Errorf("%s: malformed answered over UDP", a)
		}
		if out := e.r.handleRaw(local, "tcp", q); out == nil {
			t.Errorf("%s: no TCP answer", a)
		}
	}
	if d := e.den.take(); len(d) != 9 || d[0].Reason != ReasonUnknownSession {
		t.Fatalf("denials %+v", d)
	}
	if e.up.queries() != 0 {
		t.Fatal("forwarded")
	}
}

// TestLimits: upstream-bound UDP queries beyond the limits are dropped and
// counted; TCP connections beyond them are closed.
func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"global", func(c *Config) { c.MaxInflight = 2; c.MaxTCPConns = 2 }},
		{"per session", func(c *Config) { c.PerSessionLimit = 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) { testLimits(t, newTestEnv(t, tc.mod)) })
	}
}

func testLimits(t *testing.T, e *testEnv) {
	t.Run("inflight", func(t *testing.T) {
		e.up.setDelay(300 * time.Millisecond)
		t.Cleanup(func() { e.up.setDelay(0) })
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		to := netip.AddrPortFrom(SessionAddr(1), e.r.Port())
		names := []string{"allowed.test.", "api.allowed.test.", "deep.api.allowed.test.", "rebind.test.", "long.test."}
		for _, n := range names {
			m := new(dns.Msg)
			m.SetQuestion(n, dns.TypeA)
			b, _ := m.Pack()
			if _, err := c.WriteToUDPAddrPort(b, to); err != nil {
				t.Fatal(err)
			}
		}
		got := 0
		buf := make([]byte, 4096)
		for {
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				break
			}
			got++
		}
		if d := e.r.Stats().Total.Dropped; got != 2 || d != 3 {
			t.Fatalf("%d answered, %d dropped; want 2 and 3", got, d)
		}
	})
	t.Run("tcp conns", func(t *testing.T) {
		addr := netip.AddrPortFrom(SessionAddr(1), e.r.Port()).String()
		var conns []net.Conn
		t.Cleanup(func() {
			for _, c := range conns {
				c.Close()
			}
		})
		for range 2 {
			c, err := net.Dial("tcp4", addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		time.Sleep(100 * time.Millisecond) // let the server accept both
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("third connection not closed: %v", err)
		}
		// The first two still work.
		dc := &dns.Client{Net: "tcp"}
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		if _, _, err := dc.ExchangeWithConn(m, &dns.Conn{Conn: conns[0]}); err != nil {
			t.Fatal(err)
		}
	})
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

// TestUpstreamSharing: concurrent misses for one name cost one upstream
// query, and sequential misses reuse pooled upstream sockets.
func TestUpstreamSharing(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.CacheSize = -1 })
	t.Run("singleflight", func(t *testing.T) {
		e.up.setDelay(200 * time.Millisecond)
		t.Cleanup(func() { e.up.setDelay(0) })
		n0 := e.up.queries()
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				if r := e.ask(t, 1, "tcp", "api.allowed.test.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
					t.Errorf("%v", r)
				}
			})
		}
		wg.Wait()
		if n := e.up.queries() - n0; n != 1 {
			t.Fatalf("%d upstream queries for 5 concurrent misses", n)
		}
	})
	t.Run("pooled sockets", func(t *testing.T) {
		e.up.mu.Lock()
		e.up.srcs = nil
		e.up.mu.Unlock()
		for range 20 {
			e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)
		}
		e.up.mu.Lock()
		defer e.up.mu.Unlock()
		ports := map[string]bool{}
		for _, s := range e.up.srcs {
			ports[s] = true
		}
		if len(e.up.srcs) != 20 || len(ports) > 2 {
			t.Fatalf("%d queries from %d source ports", len(e.up.srcs), len(ports))
		}
	})
}

// TestPerSessionIsolation: a session at its PerSessionLimit does not hold up
// another session's upstream-bound queries.
func TestPerSessionIsolation(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.PerSessionLimit = 1 })
	if err := e.r.SetPolicy("s2", testPolicy); err != nil {
		t.Fatal(err)
	}
	e.up.setDelay(300 * time.Millisecond)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	send := func(idx uint32, name string) {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		b, _ := m.Pack()
		if _, err := c.WriteToUDPAddrPort(b, netip.AddrPortFrom(SessionAddr(idx), e.r.Port())); err != nil {
			t.Fatal(err)
		}
	}
	send(1, "allowed.test.")
	send(1, "api.allowed.test.") // dropped: s1 has one query pending
	send(300, "rebind.test.")    // s2: answered
	from := map[netip.Addr]int{}
	buf := make([]byte, 4096)
	for {
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, src, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		from[src.Addr()]++
	}
	if from[SessionAddr(1)] != 1 || from[SessionAddr(300)] != 1 {
		t.Fatalf("answers by session address: %v", from)
	}
	if st := e.r.Stats(); st.Sessions["s1"].Dropped != 1 || st.Sessions["s2"].Dropped != 0 {
		t.Fatalf("drops: s1 %d, s2 %d", st.Sessions["s1"].Dropped, st.Sessions["s2"].Dropped)
	}
}
