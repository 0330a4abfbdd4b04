package dnsresolver

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The upstream side: failures, fresh upstream queries, shared misses, and the
// limits on upstream-bound queries, per session too.

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
