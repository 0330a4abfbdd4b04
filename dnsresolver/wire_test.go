package dnsresolver

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// What reaches the resolver's sockets and what leaves them: reply source
// addresses, addresses that are no session's, malformed packets, reflection.

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
