package dataplane

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestInboundEvasion: the ways a session could try to be reached by a peer
// no inbound rule admits, around sweep mode's inbound check (sk_lookup, which
// decides by the port a session socket holds): a port the kernel picked for
// it (a listen or a send without a bind), a port shared between two of its
// sockets of which one closes, a port shared with another session. Each must
// fail in both flow modes (packet mode checks every packet on its socket).
func TestInboundEvasion(t *testing.T) { forModes(t, testInboundEvasion) }

func testInboundEvasion(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	s, _ := d.CreateSession("ev", Limits{})
	p := startProbe(t, s, ProcOptions{})
	// send writes one datagram from a new host socket on src to dst.
	send := func(src, dst, msg string) {
		t.Helper()
		pc, err := net.ListenPacket("udp", src+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		ua, _ := net.ResolveUDPAddr("udp", dst)
		if _, err := pc.WriteTo([]byte(msg), ua); err != nil {
			t.Fatal(err)
		}
	}
	portOK := func(got string) string {
		t.Helper()
		if !strings.HasPrefix(got, "ok ") {
			t.Fatalf("probe: %s", got)
		}
		return strings.TrimPrefix(got, "ok ")
	}

	t.Run("listen without bind", func(t *testing.T) {
		for _, fam := range []string{"4", "6"} {
			port := portOK(p.Do("alisten a" + fam + " " + fam))
			target := "127.0.0.1:" + port
			if fam == "6" {
				target = "[::1]:" + port
			}
			dl := net.Dialer{Timeout: 300 * time.Millisecond}
			if c, err := dl.Dial("tcp", target); err == nil {
				c.Close()
				t.Errorf("IPv%s: a connection to the autobound listener %s was established", fam, target)
			}
			if got := p.Do("accept a" + fam + " x 50"); got != "err timeout" {
				t.Errorf("IPv%s: accept: %s, want no connection", fam, got)
			}
			// With an inbound grant, the same dial gets through.
			peer := pfx("127.0.0.1/32")
			if fam == "6" {
				peer = pfx("::1/128")
			}
			h := mustHandle(t, d, HandleRef{}, time.Time{})
			mustAllow(t, d, "ev", EgressRule{Prefix: peer, Proto: ProtoTCP, Ports: Port(portOf(t, target)), Handle: h, Inbound: true})
			c, err := dl.Dial("tcp", target)
			if err != nil {
				t.Fatalf("IPv%s: dial with an inbound grant: %v", fam, err)
			}
			c.Close()
			if got := p.Do("accept a" + fam + " y 1000"); got != "ok" {
				t.Errorf("IPv%s: accept with an inbound grant: %s", fam, got)
			}
		}
	})

	t.Run("receive on a port a send picked", func(t *testing.T) {
		peer, err := net.ListenPacket("udp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		defer peer.Close()
		h := mustHandle(t, d, HandleRef{}, time.Time{})
		mustAllow(t, d, "ev", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoUDP, Ports: Port(portOf(t, peer.LocalAddr().String())), Handle: h})
		if got := p.Do("usock u 4"); got != "ok" {
			t.Fatal(got)
		}
		if got := p.Do("sendto u " + peer.LocalAddr().String() + " hi"); got != "ok" {
			t.Fatalf("send to the granted peer: %s", got)
		}
		port := portOK(p.Do("port u"))
		send("127.0.0.6", "127.0.0.1:"+port, "uninvited")
		if got := p.Do("recv u 300"); got != "err timeout" {
			t.Errorf("datagram from an unadmitted peer to the autobound port %s: %s", port, got)
		}
		// The granted peer's reply still comes in.
		ua, _ := net.ResolveUDPAddr("udp", "127.0.0.1:"+port)
		if _, err := peer.WriteTo([]byte("reply"), ua); err != nil {
			t.Fatal(err)
		}
		if got := p.Do("recv u 1000"); !strings.HasSuffix(got, " reply") {
			t.Errorf("reply from the granted peer: %s", got)
		}
	})

	t.Run("one of two sockets on a port closes", func(t *testing.T) {
		port := portOK(p.Do("ubindr r1 127.0.0.1:0"))
		if got := portOK(p.Do("ubindr r2 127.0.0.1:" + port)); got != port {
			t.Fatalf("second bind on %s: port %s", port, got)
		}
		if got := p.Do("close r1"); got != "ok" {
			t.Fatal(got)
		}
		send("127.0.0.6", "127.0.0.1:"+port, "uninvited")
		if got := p.Do("recv r2 300"); got != "err timeout" {
			t.Errorf("datagram from an unadmitted peer after one socket of the port closed: %s", got)
		}
	})

	t.Run("a port another session holds", func(t *testing.T) {
		s2, err := d.CreateSession("ev2", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		p2 := startProbe(t, s2, ProcOptions{})
		h := mustHandle(t, d, HandleRef{}, time.Time{})
		mustAllow(t, d, "ev2", EgressRule{Prefix: pfx("127.0.0.6/32"), Proto: ProtoUDP, Handle: h, Inbound: true})
		port := portOK(p.Do("ubindr o 127.0.0.1:0"))
		got := p2.Do("ubindr o 127.0.0.1:" + port)
		if mode == FlowSweep {
			if got != "err EPERM" {
				t.Errorf("a second session's bind of the first one's port %s: %s, want err EPERM", port, got)
			}
			return
		}
		// Packet mode judges each socket by its own session: the first
		// session's socket still refuses what the second one admits.
		if !strings.HasPrefix(got, "ok ") {
			t.Fatalf("second session's bind: %s", got)
		}
		p2.Do("close o")
		send("127.0.0.6", "127.0.0.1:"+port, "uninvited")
		if got := p.Do("recv o 300"); got != "err timeout" {
			t.Errorf("datagram admitted by another session's rule: %s", got)
		}
	})
}

// TestInboundAfterModeSwitch: sockets a session opened in packet mode (where
// no bind hook takes a port hold) are checked by sweep mode's inbound check
// once an agent adopts the dataplane in sweep mode: a listener and an
// unconnected UDP socket, each refusing a peer no inbound rule admits.
func TestInboundAfterModeSwitch(t *testing.T) {
	if len(flowModes(t)) < 2 {
		t.Skip("only packet mode runs on this kernel")
	}
	cfg := testConfig(t)
	cfg.FlowMode = FlowPacket
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(cfg) })
	s, err := d.CreateSession("sw", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	p := startProbe(t, s, ProcOptions{})
	got := p.Do("listen l 127.0.0.1:0")
	if !strings.HasPrefix(got, "ok ") {
		t.Fatalf("listen: %s", got)
	}
	tport := strings.TrimPrefix(got, "ok ")
	got = p.Do("ubind u 127.0.0.1:0")
	if !strings.HasPrefix(got, "ok ") {
		t.Fatalf("ubind: %s", got)
	}
	uport := strings.TrimPrefix(got, "ok ")
	d.Close()

	cfg.FlowMode = FlowSweep
	d, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dl := net.Dialer{Timeout: 300 * time.Millisecond}
	if c, err := dl.Dial("tcp", "127.0.0.1:"+tport); err == nil {
		c.Close()
		t.Errorf("a connection to a listener made in packet mode was established in sweep mode")
	}
	pc, err := net.ListenPacket("udp", "127.0.0.6:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ua, _ := net.ResolveUDPAddr("udp", "127.0.0.1:"+uport)
	if _, err := pc.WriteTo([]byte("uninvited"), ua); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("recv u 300"); got != "err timeout" {
		t.Errorf("datagram to a UDP socket made in packet mode, in sweep mode: %s", got)
	}
}

// TestPortHoldAcrossModes: a port hold taken in sweep mode is dropped when
// its socket closes while an agent runs packet mode, so that back in sweep
// mode another session may bind that address and port.
func TestPortHoldAcrossModes(t *testing.T) {
	if len(flowModes(t)) < 2 {
		t.Skip("only packet mode runs on this kernel")
	}
	cfg := testConfig(t)
	open := func(m FlowMode) *Dataplane {
		t.Helper()
		cfg.FlowMode = m
		d, err := Open(cfg)
		if err != nil {
			t.Fatalf("open in %s mode: %v", m, err)
		}
		return d
	}
	d := open(FlowSweep)
	t.Cleanup(func() { Remove(cfg) })
	a, err := d.CreateSession("pa", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.CreateSession("pb", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pa := startProbe(t, a, ProcOptions{})
	pb := startProbe(t, b, ProcOptions{})
	got := pa.Do("ubindr u 127.0.0.1:0")
	if !strings.HasPrefix(got, "ok ") {
		t.Fatalf("ubindr: %s", got)
	}
	port := strings.TrimPrefix(got, "ok ")
	if got := pb.Do("ubindr u 127.0.0.1:" + port); got != "err EPERM" {
		t.Fatalf("another session's bind of a held port: %s, want err EPERM", got)
	}
	d.Close()
	d = open(FlowPacket)
	if got := pa.Do("close u"); got != "ok" {
		t.Fatal(got)
	}
	d.Close()
	d = open(FlowSweep)
	defer d.Close()
	if got := pb.Do("ubindr u 127.0.0.1:" + port); !strings.HasPrefix(got, "ok ") {
		t.Errorf("bind of a port whose holder closed in packet mode: %s", got)
	}
}
