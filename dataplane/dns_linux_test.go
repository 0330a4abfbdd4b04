package dataplane

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
)

// fakeResolver answers every UDP datagram and TCP connection on 0.0.0.0:port
// with "A=<the local address the query arrived at>", replying from that
// address, as the real resolver must.
func fakeResolver(t *testing.T) uint16 {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	p := ipv4.NewPacketConn(pc)
	if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 512)
		for {
			_, cm, src, err := p.ReadFrom(buf)
			if err != nil {
				return
			}
			if cm == nil {
				continue
			}
			p.WriteTo([]byte("A="+cm.Dst.String()), &ipv4.ControlMessage{Src: cm.Dst}, src)
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 512)
			c.Read(buf)
			c.Write([]byte("A=" + c.LocalAddr().(*net.TCPAddr).IP.String()))
			c.Close()
		}
	}()
	return uint16(port)
}

// TestDNSRedirect: every port-53 query of a session, UDP (connected or not)
// and TCP, IPv4 and IPv6, lands at the resolver on the session's own address,
// and the reply appears to come from the server the session asked.
func TestDNSRedirect(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	s, _ := d.CreateSession("dns", Limits{})
	p := startProbe(t, s, ProcOptions{})

	// Off: DNS is ordinary egress, denied without a rule.
	if got := p.Do("dns udp 127.0.0.53:53"); got != "err EPERM" {
		t.Fatalf("DNS with redirection off and no rule: %s", got)
	}
	port := fakeResolver(t)
	if err := d.SetDNSRedirect(port); err != nil {
		t.Fatal(err)
	}
	own := SessionDNSAddr(s.Index).String()
	cases := []struct{ cmd, want string }{
		{"dns udp 127.0.0.53:53", "ok 127.0.0.53:53 A=" + own},
		{"dns cudp 127.0.0.53:53", "ok 127.0.0.53:53 A=" + own},
		{"dns udp 127.0.0.54:53", "ok 127.0.0.54:53 A=" + own}, // any address
		{"dns cudp [::1]:53", "ok [::1]:53 A=" + own},          // IPv6, connected (as glibc does)
		{"dns udp [::1]:53", "err EPERM"},                      // IPv6 unconnected: cannot be redirected, refused
		{"dns tcp [::1]:53", "ok [::1]:53 A=" + own},
		{"dns tcp 127.0.0.53:53", "ok 127.0.0.53:53 A=" + own},
	}
	for _, tc := range cases {
		t.Run(tc.cmd, func(t *testing.T) {
			got := p.Do(tc.cmd)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// Another session is told apart by its address.
	s2, _ := d.CreateSession("dns2", Limits{})
	p2 := startProbe(t, s2, ProcOptions{})
	if got := p2.Do("dns udp 127.0.0.53:53"); !strings.HasSuffix(got, "A="+SessionDNSAddr(s2.Index).String()) {
		t.Errorf("second session: %s", got)
	}
	// Another session's resolver address is refused outright, even under a
	// grant that covers all of loopback, so a session cannot ask as another.
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "dns", EgressRule{Prefix: pfx("127.0.0.0/8"), Handle: h})
	if got := p.Do(fmt.Sprintf("dns udp %s:%d", SessionDNSAddr(s2.Index), port)); got != "err EPERM" {
		t.Errorf("direct query to another session's resolver address: %s", got)
	}
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	// Its own resolver address is fine: that is where its DNS goes anyway.
	if got := p.Do(fmt.Sprintf("dns udp %s:%d", own, port)); got != fmt.Sprintf("ok %s:%d A=%s", own, port, own) {
		t.Errorf("direct query to its own resolver address: %s", got)
	}
	// Off again: denied again.
	if err := d.SetDNSRedirect(0); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("dns udp 127.0.0.53:53"); got != "err EPERM" {
		t.Errorf("after turning redirection off: %s", got)
	}
}
