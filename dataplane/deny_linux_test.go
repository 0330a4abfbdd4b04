package dataplane

import (
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestDenyCutsFlows: a deny entry written while flows are open cuts the
// TCP connection and the connected UDP socket to the peer it names (sweep
// mode destroys them; packet mode drops their next packets), refuses new
// connects with ReasonForbidden, leaves a flow to another peer alone, and
// emptying the table lets a new flow through again. An attacker's open
// socket to a newly forbidden address does not outlive the policy change.
func TestDenyCutsFlows(t *testing.T) { forModes(t, testDenyCutsFlows) }

func testDenyCutsFlows(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	s, _ := d.CreateSession("dn", Limits{})
	srv := listenTCP(t, "127.0.0.2:0")
	us := listenUDP(t, "127.0.0.2:0")
	keep := listenTCP(t, "127.0.0.3:0")
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "dn", EgressRule{Prefix: pfx("127.0.0.0/8"), Handle: h})
	p := startProbe(t, s, ProcOptions{})
	for _, c := range []string{"open c1 tcp " + srv.addr(), "open u1 udp " + us.addr(), "open k1 tcp " + keep.addr(), "write c1 before", "write k1 before"} {
		if got := p.Do(c); got != "ok" {
			t.Fatalf("%s: %s", c, got)
		}
	}
	expectData(t, srv.data, "before")
	expectData(t, keep.data, "before")
	p.Do("write u1 before")
	expectData(t, us.data, "before")

	if err := d.SetDenyList([]backend.DenyEntry{{Prefix: pfx("127.0.0.2/32"), Lo: 0, Hi: 0xffff}}); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("tcp " + srv.addr()); got != "err EPERM" {
		t.Errorf("connect to a denied peer: %s", got)
	}
	cnt, _ := d.Counters(s.Index)
	if cnt[ReasonForbidden] == 0 {
		t.Errorf("counters %v: want a forbidden denial", cnt)
	}
	w1, w2 := p.Do("write c1 after"), p.Do("write u1 after")
	if mode == FlowSweep && (w1 == "ok" || w2 == "ok") {
		t.Errorf("writes on destroyed sockets: tcp %q, udp %q (want errors)", w1, w2)
	}
	expectNoData(t, srv.data, 700*time.Millisecond)
	expectNoData(t, us.data, 100*time.Millisecond)
	if got := p.Do("write k1 kept"); got != "ok" {
		t.Fatalf("write to a peer no entry names: %s", got)
	}
	expectData(t, keep.data, "kept")

	if err := d.SetDenyList(nil); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("open c2 tcp " + srv.addr()); got != "ok" {
		t.Fatalf("connect after the table was emptied: %s", got)
	}
	p.Do("write c2 again")
	expectData(t, srv.data, "again")
}
