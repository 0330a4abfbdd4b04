package backendtest

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// dnsRule is an entry as the resolver writes it: one address, an expiry.
func dnsRule(i int, h backend.HandleRef, exp time.Time) backend.EgressRule {
	a := netip.AddrFrom4([4]byte{10, 77, byte(i >> 8), byte(i)})
	return backend.EgressRule{Prefix: netip.PrefixFrom(a, 32), Proto: backend.ProtoTCP, Ports: portRange(443), Handle: h, Expires: exp}
}

// fillToCap writes DNS entries expiring at exp into session until the
// backend refuses one with ErrEntryCap, and returns how many it took.
func fillToCap(t *testing.T, b backend.Backend, session string, h backend.HandleRef, exp time.Time) int {
	t.Helper()
	for i := 0; i < 1<<16; i++ {
		err := b.AllowEgress(session, dnsRule(i, h, exp))
		if errors.Is(err, backend.ErrEntryCap) {
			if i == 0 {
				t.Fatal("the first DNS entry refused for the cap")
			}
			return i
		}
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	t.Fatal("65,536 DNS entries and no ErrEntryCap: the session's DNS-derived entries are not capped")
	return 0
}

// testDNSEntryCap: a session's DNS-derived entries (rules with an expiry,
// from AllowEgress) stop at a cap with ErrEntryCap, the refused entry not
// added; a refresh of an entry there, a rule without expiry and another
// session's entries still go in; once the entries expire the cap is free
// again (within a few seconds).
func testDNSEntryCap(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	mustSession(t, b, "s2")
	h := mustHandle(t, b, backend.HandleRef{})
	exp := time.Now().Add(time.Hour)
	began := time.Now()
	n := fillToCap(t, b, "s1", h, exp)
	took := time.Since(began)
	if got := len(rulesOf(t, b, "s1").Egress); got != n {
		t.Fatalf("%d entries after the cap of %d", got, n)
	}
	if err := b.AllowEgress("s1", dnsRule(0, h, exp.Add(time.Hour))); err != nil {
		t.Fatalf("refresh at the cap: %v", err)
	}
	grant := egress("192.0.2.9", 443, h) // a grant's rule: no expiry
	if err := b.AllowEgress("s1", grant); err != nil {
		t.Fatalf("a rule without expiry at the cap: %v", err)
	}
	// s2's entries expire well after its fill ends: a loaded machine made
	// a fill take longer than a fixed 1.5 s, and entries expired during
	// it were reclaimed (so the fill passed n).
	exp2 := time.Now().Add(1500*time.Millisecond + 3*took)
	if m := fillToCap(t, b, "s2", h, exp2); m != n {
		t.Fatalf("session s2 took %d entries, s1 %d", m, n)
	}
	// s2's entries expire; a new one then goes in.
	time.Sleep(time.Until(exp2))
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := b.AllowEgress("s2", dnsRule(n, h, time.Now().Add(time.Hour)))
		if err == nil {
			break
		}
		if !errors.Is(err, backend.ErrEntryCap) || time.Now().After(deadline) {
			t.Fatalf("after the entries expired: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantErr(t, "s1 still at its cap", b.AllowEgress("s1", dnsRule(n+1, h, exp)), backend.ErrEntryCap)
}
