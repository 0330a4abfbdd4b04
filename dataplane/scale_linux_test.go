package dataplane

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TestScale loads 10,000 sessions with 100 egress entries each and shows that
// a session costs the same at 10,000 as at 10: the programs stay attached
// once at the parent (checked structurally) and a new session is one mkdir
// plus one map insert (timings are logged; the comparison with figures lives
// in bench/, not in a timed test). Enforcement is then checked on a session
// created last.
func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the scale test loads 1,000,000 entries")
	}
	const sessions, entries = 10000, 100
	cfg := testConfig(t)
	cfg.MaxSessions = 16384
	cfg.MaxHandles = 16384
	cfg.MaxEgress4 = 2 << 20
	d := newDataplane(t, cfg)
	h := mustHandle(t, d, HandleRef{}, time.Time{})

	createTimed := func(name string) time.Duration {
		start := time.Now()
		if _, err := d.CreateSession(name, Limits{}); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	fill := func(name string, i int) {
		for j := 0; j < entries; j++ {
			// 10.x.y.z/32: distinct per session and entry.
			a := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(j)})
			if err := d.AllowEgress(name, EgressRule{Prefix: netip.PrefixFrom(a, 32), Proto: ProtoTCP, Ports: Port(443), Handle: h}); err != nil {
				t.Fatalf("session %d entry %d: %v", i, j, err)
			}
		}
	}

	var at10 time.Duration
	start := time.Now()
	for i := 0; i < sessions; i++ {
		dt := createTimed(fmt.Sprintf("s%d", i))
		if i < 10 {
			at10 += dt
		}
		fill(fmt.Sprintf("s%d", i), i)
	}
	t.Logf("loaded %d sessions x %d entries in %v", sessions, entries, time.Since(start))

	attached, err := d.attachedPrograms()
	if err != nil {
		t.Fatal(err)
	}
	if want := hooksIn(d.FlowMode()); attached != want {
		t.Fatalf("%d programs attached at the parent with %d sessions, want %d (one per hook)", attached, sessions, want)
	}

	var at10k time.Duration
	for i := 0; i < 10; i++ {
		at10k += createTimed(fmt.Sprintf("late%d", i))
	}
	t.Logf("session create: mean %v for the first 10, %v at 10,000 (bench/ has the measured comparison)", at10/10, at10k/10)

	// Enforcement at scale: the last session is allowed exactly its entries.
	last, _ := d.Session("late9")
	srv := listenTCP(t, "127.0.0.2:0")
	mustAllow(t, d, "late9", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoTCP, Ports: Port(portOf(t, srv.addr())), Handle: h})
	p := startProbe(t, last, ProcOptions{})
	if got := p.Do("tcp " + srv.addr()); got != "ok" {
		t.Errorf("allowed at scale: %s", got)
	}
	if got := p.Do("tcp 10.0.0.1:443"); got != "err EPERM" {
		t.Errorf("another session's entry leaked: %s", got)
	}
	if got := p.Do("tcp 127.0.0.3:" + fmt.Sprint(portOf(t, srv.addr()))); got != "err EPERM" {
		t.Errorf("denied at scale: %s", got)
	}
}
