package dataplane

import (
	"fmt"
	"testing"
	"time"
)

// TestOnceMeansOnce: an approve-once handle is consumed in the kernel by
// its first allowed connect or send: the second gets EPERM with no round
// trip to user space, the flow the first opened lives on, and of connects
// racing from several threads, and from several processes pinned to their
// own CPUs over many rounds (raceOnceProcesses), exactly one wins. The race
// is evidence; TestOnceIsCompareAndSwap checks the atomicity in the program.
func TestOnceMeansOnce(t *testing.T) { forModes(t, testOnce) }

func testOnce(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	s, err := d.CreateSession("once", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	srv := listenTCP(t, "127.0.0.2:0")
	us := listenUDP(t, "127.0.0.2:0")
	h, err := d.NewOnceHandle(HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	mustAllow(t, d, "once", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoTCP, Handle: h})
	p := startProbe(t, s, ProcOptions{})
	if got := p.Do("open c1 tcp " + srv.addr()); got != "ok" {
		t.Fatalf("first connect under an approve-once handle: %s", got)
	}
	if got := p.Do("tcp " + srv.addr()); got != "err EPERM" {
		t.Fatalf("second connect: %s, want err EPERM", got)
	}
	if st := handleState(t, d, h); st != HandleUsed {
		t.Fatalf("handle state after its use: %s, want used", st)
	}
	// the flow the one use opened lives on (packet mode checks every packet)
	if got := p.Do("write c1 still"); got != "ok" {
		t.Fatalf("write on the flow: %s", got)
	}
	expectData(t, srv.data, "still")
	// revoke still kills it
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	if st := handleState(t, d, h); st != HandleRevoked {
		t.Fatalf("state after revoke: %s", st)
	}

	// unconnected UDP: each send is a use
	hu, err := d.NewOnceHandle(HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	mustAllow(t, d, "once", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoUDP, Handle: hu})
	if got := p.Do("udp " + us.addr()); got != "ok" {
		t.Fatalf("first send: %s", got)
	}
	expectData(t, us.data, "x")
	if got := p.Do("udp " + us.addr()); got != "err EPERM" {
		t.Fatalf("second send: %s, want err EPERM", got)
	}

	// racing connects from several threads: exactly one wins, every round
	for i := 0; i < 10; i++ {
		addr := fmt.Sprintf("127.0.1.%d", i+1)
		rs := listenTCP(t, addr+":0")
		hr, err := d.NewOnceHandle(HandleRef{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		mustAllow(t, d, "once", EgressRule{Prefix: pfx(addr + "/32"), Handle: hr})
		n := 2 + i%3 // 2, 3 or 4 threads
		want := fmt.Sprintf("ok 1 %d 0", n-1)
		if got := p.Do(fmt.Sprintf("race %d %s", n, rs.addr())); got != want {
			t.Fatalf("round %d: %d threads connecting at once under one approve-once handle: %s, want %s", i, n, got, want)
		}
	}
	raceOnceProcesses(t, d, s)
}

func handleState(t *testing.T, d *Dataplane, ref HandleRef) HandleState {
	t.Helper()
	hs, err := d.Handles()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Ref == ref {
			return h.State
		}
	}
	t.Fatalf("handle %s not in the table", ref)
	return 0
}
