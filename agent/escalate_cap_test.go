package agent

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestEscalationFlood, on the memory backend: a session whose image
// escalates net.egress is refused by the backend on 6,000 distinct
// destinations (real refusals, read from the backend's event stream and
// given to KernelDenial as the daemon does). It opens at most its cap of
// escalation cards, never more decisions than that, and the cap's hold-back
// is reported (escalation.capped); denials in the prefix of a pending card
// join it; deciding a card frees a place; another session keeps its own
// cap.
func TestEscalationFlood(t *testing.T) {
	d := memKernel(t)
	ms, err := ParseManifests("flood.manifest", []byte("image flood\nallow net.egress cidrs=10.0.0.0/8 tier=ask\nescalate net.egress\n"))
	if err != nil {
		t.Fatal(err)
	}
	log := &eventLog{}
	a := openAgent(t, d, t.TempDir(), func(c *Config) {
		c.Manifests = map[string]*Manifest{"flood": ms[0]}
		c.EscalationCards = 4
		c.Events = log
		c.Breaker = BreakerConfig{Consecutive: 1 << 30, Total: 1 << 30} // this test is about cards
	})
	mustSession(t, a, SessionSpec{ID: "a", Image: "flood"})
	mustSession(t, a, SessionSpec{ID: "b", Image: "flood"})
	rd, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	flood := func(session string, dsts []string) int {
		t.Helper()
		n := 0
		for len(dsts) > 0 {
			chunk := dsts[:min(len(dsts), 256)] // within the backend's event ring
			dsts = dsts[len(chunk):]
			for _, dst := range chunk {
				if got := connectTCP(t, d, session, dst); got != backend.ReasonNoRule {
					t.Fatalf("connect %s: %s", dst, got)
				}
			}
			for range chunk {
				rd.SetDeadline(time.Now().Add(2 * time.Second))
				ev, err := rd.Read()
				if err != nil {
					t.Fatalf("read denial %d: %v", n, err)
				}
				n++
				if err := a.KernelDenial(ctx, ev); err != nil {
					t.Fatalf("kernel denial: %v", err)
				}
			}
		}
		return n
	}
	cardsOf := func(session string) []Card {
		var out []Card
		for _, c := range a.Cards(false) {
			if c.Session == session && c.Status == CardPending {
				out = append(out, c)
			}
		}
		return out
	}
	count := func(kind string) int {
		n := 0
		for _, k := range log.kinds() {
			if k == kind {
				n++
			}
		}
		return n
	}

	// 6,000 distinct destinations in 3,000 /24s.
	var dsts []string
	for i := range 6000 {
		dsts = append(dsts, fmt.Sprintf("10.%d.%d.%d:443", i/512, (i/2)%256, 1+i%2))
	}
	start := time.Now()
	read := flood("a", dsts)
	took := time.Since(start)
	if read != len(dsts) {
		t.Fatalf("%d denial events read, want %d", read, len(dsts))
	}
	got := cardsOf("a")
	if len(got) != 4 {
		t.Fatalf("%d denial events opened %d pending cards, want the cap of 4", read, len(got))
	}
	if n := count(EventRequest); n != 4 {
		t.Fatalf("%d requests decided for the flood, want 4 (one per card)", n)
	}
	if count(EventEscalationCapped) == 0 {
		t.Fatal("no escalation.capped event: the cap held denials back silently")
	}
	t.Logf("%d denial events in %v: %d cards, %d escalation.capped events", read, took.Round(time.Millisecond), len(got), count(EventEscalationCapped))

	// A denial in the prefix of a pending card joins it.
	first := got[0].Items[0].Scope.Egress.CIDRs[0].Addr()
	same := netip.AddrFrom4([4]byte{first.As4()[0], first.As4()[1], first.As4()[2], 200})
	card, opened, err := a.EscalateDenial(ctx, "a", netip.AddrPortFrom(same, 443))
	if err != nil || opened || card != got[0].ID {
		t.Fatalf("denial in a pending card's /24: card %q opened %v err %v; want %s", card, opened, err, got[0].ID)
	}

	// Another session has its own cap.
	flood("b", []string{"10.200.0.1:443", "10.201.0.1:443"})
	if n := len(cardsOf("b")); n != 2 {
		t.Fatalf("session b: %d cards, want 2", n)
	}

	// Deciding a card frees a place: the next new prefix opens a card.
	if _, err := a.DenyCard(ctx, got[0].ID, "alice"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(escalationRecheck)
	card, opened, err = a.EscalateDenial(ctx, "a", netip.MustParseAddrPort("10.250.0.1:443"))
	if err != nil || !opened || card == "" {
		t.Fatalf("after a card was decided: %q %v %v", card, opened, err)
	}
	if n := len(cardsOf("a")); n != 4 {
		t.Fatalf("session a: %d pending cards, want 4", n)
	}
	for _, e := range log.ev {
		if e.Kind == EventEscalationCapped && !strings.Contains(e.Outcome, "held back") {
			t.Fatalf("capped event %+v", e)
		}
	}
}

// TestEscalatesFollowsSessionAndManifests: what escalates remembers of a
// session (so that a flood of denials takes no a.mu per denial) is dropped
// when the session ends, so a new session of that name with another image
// is asked anew, and when the manifests are reloaded.
func TestEscalatesFollowsSessionAndManifests(t *testing.T) {
	dir := t.TempDir()
	write := func(escalate string) {
		m := "image loud\nallow net.egress cidrs=127.0.0.0/24\n" + escalate + "image quiet\nallow net.egress cidrs=127.0.0.0/24\n"
		if err := os.WriteFile(filepath.Join(dir, "m.manifest"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("escalate net.egress\n")
	a := openAgent(t, memKernel(t), t.TempDir(), func(c *Config) { c.Manifests = nil; c.ManifestDir = dir })
	mustSession(t, a, SessionSpec{ID: "x", Image: "loud"})
	for i := 0; i < 2; i++ { // asked, then remembered
		if !a.escalates("x", ClassNetEgress) || a.escalates("x", ClassNetInbound) {
			t.Fatalf("round %d: x (image loud) escalates net.egress %v, net.inbound %v; want true, false", i, a.escalates("x", ClassNetEgress), a.escalates("x", ClassNetInbound))
		}
	}
	if err := a.EndSession("x"); err != nil {
		t.Fatal(err)
	}
	if a.escalates("x", ClassNetEgress) {
		t.Fatal("an ended session still escalates")
	}
	mustSession(t, a, SessionSpec{ID: "x", Image: "quiet"})
	if a.escalates("x", ClassNetEgress) {
		t.Fatal("a new session x of image quiet escalates as the ended x (image loud) did")
	}
	mustSession(t, a, SessionSpec{ID: "y", Image: "loud"})
	if !a.escalates("y", ClassNetEgress) {
		t.Fatal("y (image loud) does not escalate")
	}
	write("")
	if err := a.ReloadManifests(); err != nil {
		t.Fatal(err)
	}
	if a.escalates("y", ClassNetEgress) {
		t.Fatal("after a reload without escalate lines, y still escalates")
	}
}
