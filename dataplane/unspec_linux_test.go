package dataplane

import (
	"net/netip"
	"testing"
	"time"
)

// TestUnspecifiedIsLoopback (issue 22, build item 3): the kernel turns an
// unspecified destination into a local address after the connect and send
// hooks have run (0.0.0.0 and ::ffff:0.0.0.0 into 127.0.0.1, or into the
// address the socket is bound to; :: into ::1). The hooks treat it as
// loopback (they rewrite it to 127.0.0.1, ::ffff:127.0.0.1 or ::1 and check
// that), so under a 0.0.0.0/0 and ::/0 grant a never-listed loopback
// listener stays unreachable through every spelling, TCP and UDP, while a
// loopback listener that is not listed is still reached through them.
func TestUnspecifiedIsLoopback(t *testing.T) { forModes(t, testUnspecifiedIsLoopback) }

func testUnspecifiedIsLoopback(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	s, err := d.CreateSession("unspec", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	never4, never6 := listenTCP(t, "127.0.0.1:0"), listenTCP(t, "[::1]:0")
	other4, other6 := listenTCP(t, "127.0.0.1:0"), listenTCP(t, "[::1]:0")
	bound := listenTCP(t, "127.0.0.7:0") // reached through 0.0.0.0 from a socket bound to 127.0.0.7
	never4u, never6u := listenUDP(t, "127.0.0.1:0"), listenUDP(t, "[::1]:0")
	other4u := listenUDP(t, "127.0.0.1:0")
	port := func(addr string) uint16 { return netip.MustParseAddrPort(addr).Port() }
	list := DefaultNeverList()
	for _, n := range []struct {
		prefix string
		addr   string
	}{{"127.0.0.1/32", never4.addr()}, {"127.0.0.7/32", bound.addr()}, {"::1/128", never6.addr()}, {"127.0.0.1/32", never4u.addr()}, {"::1/128", never6u.addr()}} {
		list = append(list, NeverEntry{Prefix: pfx(n.prefix), Port: port(n.addr)})
	}
	if err := d.SetNeverList(list); err != nil {
		t.Fatal(err)
	}
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "unspec", EgressRule{Prefix: pfx("0.0.0.0/0"), Handle: h})
	mustAllow(t, d, "unspec", EgressRule{Prefix: pfx("::/0"), Handle: h})
	p := startProbe(t, s, ProcOptions{})

	at := func(host string, addr string) string {
		return netip.AddrPortFrom(netip.MustParseAddr(host), port(addr)).String()
	}
	refused := []string{
		// The listed addresses themselves (what the never-list always did).
		"tcp " + never4.addr(), "tcp6 " + never6.addr(),
		// 0.0.0.0 and ::ffff:0.0.0.0 reach 127.0.0.1.
		"tcp " + at("0.0.0.0", never4.addr()),
		"tcp6 " + at("0.0.0.0", never4.addr()), // sent as ::ffff:0.0.0.0
		"tcp6 " + at("::ffff:0.0.0.0", never4.addr()),
		"udp " + at("0.0.0.0", never4u.addr()),
		"cudp " + at("0.0.0.0", never4u.addr()),
		"udp6 " + at("0.0.0.0", never4u.addr()),
		// :: reaches ::1.
		"tcp6 " + at("::", never6.addr()),
		"udp6 " + at("::", never6u.addr()),
	}
	for _, cmd := range refused {
		if got := p.Do(cmd); got != "err EPERM" {
			t.Errorf("%s (never-listed behind it) under 0.0.0.0/0 and ::/0 grants: %s, want err EPERM", cmd, got)
		} else {
			t.Logf("verified: %s refused", cmd)
		}
	}
	// A socket bound to 127.0.0.7: the kernel would send 0.0.0.0 to
	// 127.0.0.7, the hook sends it to 127.0.0.1 (no listener on that port
	// there). Either way it must not reach the listener on 127.0.0.7.
	if got := p.Do("tcpfrom 127.0.0.7:0 " + at("0.0.0.0", bound.addr())); got == "ok" {
		t.Errorf("tcp 0.0.0.0 from a socket bound to 127.0.0.7 reached the never-listed 127.0.0.7 listener")
	} else {
		t.Logf("verified: 0.0.0.0 from a socket bound to 127.0.0.7 does not reach its never-listed listener (%s)", got)
	}
	expectNoData(t, never4u.data, 200*time.Millisecond)
	expectNoData(t, never6u.data, 50*time.Millisecond)

	// Not listed: the unspecified spellings still reach loopback.
	reached := []string{
		"tcp " + at("0.0.0.0", other4.addr()),
		"tcp6 " + at("0.0.0.0", other4.addr()),
		"tcp6 " + at("::", other6.addr()),
	}
	for _, cmd := range reached {
		if got := p.Do(cmd); got != "ok" {
			t.Errorf("%s (not listed): %s, want ok", cmd, got)
		}
	}
	if got := p.Do("udp " + at("0.0.0.0", other4u.addr())); got != "ok" {
		t.Errorf("udp to 0.0.0.0 (not listed): %s", got)
	}
	expectData(t, other4u.data, "x")
}
