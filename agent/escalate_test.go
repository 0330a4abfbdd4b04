package agent

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestEscalationBurst, on the memory backend (no root, any GOOS): a burst
// of 1,000 backend denials to one destination opens exactly one Ask card
// for exactly that scope (once, the address /32, the port), even for a
// destination the tier table would auto-grant; the same from 1,000
// concurrent reports; off for an image whose manifest does not say
// "escalate net.egress". TestEscalationBurstKernel runs the same with real
// connects and the kernel's own denial events.
func TestEscalationBurst(t *testing.T) {
	d := memKernel(t)
	const srv = "127.0.0.9:8080"
	testEscalationBurst(t, d, srv, func(i int) {
		if got := connectTCP(t, d, "s1", srv); got != backend.ReasonNoRule {
			t.Fatalf("connect %d: %s, want %s", i, got, backend.ReasonNoRule)
		}
	})
}

// testEscalationBurst: an agent on d with sessions s1 (its image escalates
// net.egress) and s2 (it does not); deny(i) makes the i-th of 1,000 uses
// of srv from s1 that d refuses, and d's denial events go to EscalateDenial
// as the daemon's event loop sends them.
func testEscalationBurst(t *testing.T, d Kernel, srv string, deny func(i int)) {
	ms, err := ParseManifests("esc.manifest", []byte(testManifest+"escalate net.egress\nimage quiet\nallow net.egress cidrs=127.0.0.0/24\n"))
	if err != nil {
		t.Fatal(err)
	}
	man := map[string]*Manifest{}
	for _, m := range ms {
		man[m.Image] = m
	}
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Manifests = man })
	mustSession(t, a, SessionSpec{ID: "s1"})
	mustSession(t, a, SessionSpec{ID: "s2", Image: "quiet"})

	rd, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var opened, seen atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			rd.SetDeadline(time.Now().Add(2 * time.Second))
			ev, err := rd.Read()
			if err != nil {
				return
			}
			if ev.Reason != backend.ReasonNoRule {
				continue
			}
			seen.Add(1)
			s, err := d.SessionByIndex(ev.Session)
			if err != nil {
				continue
			}
			if _, op, err := a.EscalateDenial(ctx, s.Name, ev.Dst); err != nil {
				t.Errorf("escalate: %v", err)
			} else if op {
				opened.Add(1)
			}
		}
	}()
	for i := 0; i < 1000; i++ {
		deny(i)
	}
	<-done
	cards := a.Cards(false)
	if opened.Load() != 1 || len(cards) != 1 {
		t.Fatalf("%d denial events (of 1,000) opened %d cards (%d pending); want one", seen.Load(), opened.Load(), len(cards))
	}
	it := cards[0].Items
	want := netip.MustParseAddrPort(srv)
	if cards[0].Session != "s1" || len(it) != 1 || it[0].Tier != TierAsk || it[0].Lifecycle != LifecycleOnce ||
		len(it[0].Scope.Egress.CIDRs) != 1 || it[0].Scope.Egress.CIDRs[0] != netip.PrefixFrom(want.Addr(), 32) ||
		len(it[0].Scope.Egress.Ports) != 1 || it[0].Scope.Egress.Ports[0].Lo != want.Port() {
		t.Fatalf("card %+v: want one Ask item, once, %s", cards[0], want)
	}
	t.Logf("%d denial events reached the agent, one card: %s", seen.Load(), cards[0].ID)

	// 1,000 concurrent reports of another destination (in another /24: one
	// in srv's would join srv's pending card, escalate_cap.go): one card.
	other := netip.MustParseAddrPort("127.0.1.10:8080")
	var wg sync.WaitGroup
	var n atomic.Int64
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, op, err := a.EscalateDenial(ctx, "s1", other); err == nil && op {
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if n.Load() != 1 || len(a.Cards(false)) != 2 {
		t.Fatalf("concurrent burst opened %d cards", n.Load())
	}
	// off by default
	if c, op, err := a.EscalateDenial(ctx, "s2", netip.MustParseAddrPort("127.0.0.11:80")); c != "" || op || err != nil {
		t.Fatalf("escalation for an image without it: %q %v %v", c, op, err)
	}
	if len(a.Cards(false)) != 2 {
		t.Fatal("a card for an image without escalation")
	}
}
