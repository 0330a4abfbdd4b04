package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestInbound: a peer opening a flow to a session (a TCP connection to its
// listener, a datagram to its unconnected UDP socket) is refused unless an
// inbound rule of the session admits it (source prefix, local port) under a
// live handle; egress grants admit nobody in. Revoking the inbound handle (one
// write) refuses the next SYN and cuts the accepted connection. The session's
// own egress needs no inbound grant: its TCP handshakes and UDP replies pass.
func TestInbound(t *testing.T) { forModes(t, testInbound) }

func testInbound(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	s, _ := d.CreateSession("in", Limits{})
	p := startProbe(t, s, ProcOptions{})
	rd, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	for _, tc := range []struct{ name, listen, peer, other string }{
		{"ipv4", "127.0.0.1:0", "127.0.0.6", "127.0.0.5"},
		{"ipv6", "[::1]:0", "::1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := "l" + tc.name
			got := p.Do("listen " + l + " " + tc.listen)
			if !strings.HasPrefix(got, "ok ") {
				t.Fatalf("listen: %s", got)
			}
			port := strings.TrimPrefix(got, "ok ")
			target := net.JoinHostPort(netip.MustParseAddrPort(tc.listen).Addr().String(), port)
			lport := netip.MustParseAddrPort(target).Port()
			dial := func(src string) (net.Conn, error) {
				// A dropped SYN is retransmitted after a second: 300 ms is
				// a refusal, loopback answers in microseconds.
				dl := net.Dialer{Timeout: 300 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
				return dl.Dial("tcp", target)
			}
			refused := func(src, why string) {
				t.Helper()
				before, _ := d.Counters(s.Index)
				if c, err := dial(src); err == nil {
					c.Close()
					t.Fatalf("%s: a connection from %s was established", why, src)
				}
				if got := p.Do("accept " + l + " x 50"); got != "err timeout" {
					t.Errorf("%s: accept: %s, want no connection", why, got)
				}
				after, _ := d.Counters(s.Index)
				if after[ReasonNoInbound] <= before[ReasonNoInbound] {
					t.Errorf("%s: no_inbound counter %d -> %d", why, before[ReasonNoInbound], after[ReasonNoInbound])
				}
				waitEvent(t, rd, func(ev Event) bool {
					return ev.Reason == ReasonNoInbound && ev.Session == s.Index && ev.Proto == ProtoTCP &&
						ev.Dst == netip.AddrPortFrom(netip.MustParseAddr(src), lport)
				})
			}

			refused(tc.peer, "no grant")
			// An egress grant covering the peer (every port) admits nobody in.
			peerPfx := netip.PrefixFrom(netip.MustParseAddr(tc.peer), netip.MustParseAddr(tc.peer).BitLen())
			eh := mustHandle(t, d, HandleRef{}, time.Time{})
			mustAllow(t, d, "in", EgressRule{Prefix: peerPfx, Handle: eh})
			refused(tc.peer, "egress grant only")
			if err := d.Revoke(eh); err != nil {
				t.Fatal(err)
			}

			h := mustHandle(t, d, HandleRef{}, time.Time{})
			mustAllow(t, d, "in", EgressRule{Prefix: peerPfx, Proto: ProtoTCP, Ports: Port(lport), Handle: h, Inbound: true})
			// Another port of the session is not covered.
			if got := p.Do("listen " + l + "b " + tc.listen); strings.HasPrefix(got, "ok ") {
				other := net.JoinHostPort(netip.MustParseAddrPort(target).Addr().String(), strings.TrimPrefix(got, "ok "))
				dl := net.Dialer{Timeout: 300 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP(tc.peer)}}
				if c, err := dl.Dial("tcp", other); err == nil {
					c.Close()
					t.Errorf("inbound grant for port %d admitted a connection to %s", lport, other)
				}
			}
			if tc.other != "" {
				refused(tc.other, "peer outside the inbound prefix")
			}
			c, err := dial(tc.peer)
			if err != nil {
				t.Fatalf("dial with the inbound grant: %v", err)
			}
			defer c.Close()
			if got := p.Do("accept " + l + " c" + tc.name + " 1000"); got != "ok" {
				t.Fatalf("accept with the inbound grant: %s", got)
			}
			p.Do("write c" + tc.name + " hello")
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 64)
			if n, err := c.Read(buf); string(buf[:n]) != "hello" {
				t.Errorf("admitted peer read %q, %v", buf[:n], err)
			}
			// The flow lives under the inbound grant alone: a revoke of
			// something else (sweep mode: a sweep of every socket) keeps it.
			if err := d.Revoke(mustHandle(t, d, HandleRef{}, time.Time{})); err != nil {
				t.Fatal(err)
			}
			p.Do("write c" + tc.name + " still")
			if n, err := c.Read(buf); string(buf[:n]) != "still" {
				t.Errorf("admitted peer read %q after an unrelated revoke, %v", buf[:n], err)
			}

			// Revoke: the next SYN is refused, the accepted flow is cut
			// (sweep: destroyed; packet: its packets dropped).
			if err := d.Revoke(h); err != nil {
				t.Fatal(err)
			}
			p.Do("write c" + tc.name + " after")
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if n, _ := c.Read(buf); n > 0 {
				t.Errorf("read %q from an inbound flow after its grant was revoked", buf[:n])
			}
			refused(tc.peer, "after revoke")
		})
	}

	t.Run("udp", func(t *testing.T) {
		got := p.Do("ubind u 127.0.0.1:0")
		if !strings.HasPrefix(got, "ok ") {
			t.Fatalf("ubind: %s", got)
		}
		target := "127.0.0.1:" + strings.TrimPrefix(got, "ok ")
		lport := netip.MustParseAddrPort(target).Port()
		send := func(src, msg string) net.PacketConn {
			t.Helper()
			pc, err := net.ListenPacket("udp", src+":0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pc.Close() })
			ua, _ := net.ResolveUDPAddr("udp", target)
			if _, err := pc.WriteTo([]byte(msg), ua); err != nil {
				t.Fatal(err)
			}
			return pc
		}
		before, _ := d.Counters(s.Index)
		send("127.0.0.7", "uninvited")
		if got := p.Do("recv u 300"); got != "err timeout" {
			t.Errorf("datagram from an unadmitted peer: %s", got)
		}
		after, _ := d.Counters(s.Index)
		if after[ReasonNoInbound] <= before[ReasonNoInbound] {
			t.Errorf("no_inbound counter %d -> %d", before[ReasonNoInbound], after[ReasonNoInbound])
		}
		waitEvent(t, rd, func(ev Event) bool {
			return ev.Reason == ReasonNoInbound && ev.Proto == ProtoUDP && ev.Dst == netip.MustParseAddrPort(fmt.Sprintf("127.0.0.7:%d", lport))
		})
		h := mustHandle(t, d, HandleRef{}, time.Time{})
		mustAllow(t, d, "in", EgressRule{Prefix: pfx("127.0.0.7/32"), Proto: ProtoUDP, Ports: Port(lport), Handle: h, Inbound: true})
		send("127.0.0.7", "invited")
		if got := p.Do("recv u 1000"); !strings.HasSuffix(got, " invited") {
			t.Errorf("datagram from an admitted peer: %s", got)
		}
		if err := d.Revoke(h); err != nil {
			t.Fatal(err)
		}
		send("127.0.0.7", "again")
		if got := p.Do("recv u 300"); got != "err timeout" {
			t.Errorf("datagram after revoke: %s", got)
		}
	})

	// The session's egress, without any inbound grant: a TCP connect (its
	// SYN-ACK comes in) and a UDP exchange (the reply comes in).
	t.Run("egress replies", func(t *testing.T) {
		srv := listenTCP(t, "127.0.0.8:0")
		echo, err := net.ListenPacket("udp", "127.0.0.8:0")
		if err != nil {
			t.Fatal(err)
		}
		defer echo.Close()
		go func() {
			buf := make([]byte, 512)
			for {
				n, from, err := echo.ReadFrom(buf)
				if err != nil {
					return
				}
				echo.WriteTo(append([]byte("re:"), buf[:n]...), from)
			}
		}()
		h := mustHandle(t, d, HandleRef{}, time.Time{})
		mustAllow(t, d, "in", EgressRule{Prefix: pfx("127.0.0.8/32"), Handle: h})
		if got := p.Do("open e tcp " + srv.addr()); got != "ok" {
			t.Fatalf("connect out: %s", got)
		}
		p.Do("write e out")
		expectData(t, srv.data, "out")
		if got := p.Do("ubind r 127.0.0.1:0"); !strings.HasPrefix(got, "ok ") {
			t.Fatal(got)
		}
		if got := p.Do("sendto r " + echo.LocalAddr().String() + " ping"); got != "ok" {
			t.Fatalf("sendto: %s", got)
		}
		if got := p.Do("recv r 1000"); got != "ok "+echo.LocalAddr().String()+" re:ping" {
			t.Errorf("UDP reply to the session's own send: %s", got)
		}
	})
}

// waitEvent reads events until match, failing after three seconds.
func waitEvent(t testing.TB, rd backend.EventReader, match func(Event) bool) {
	t.Helper()
	rd.SetDeadline(time.Now().Add(3 * time.Second))
	for {
		ev, err := rd.Read()
		if err != nil {
			t.Errorf("no matching event: %v", err)
			return
		}
		if match(ev) {
			return
		}
	}
}
