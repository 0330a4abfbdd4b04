package dataplane

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// scanCover is the cover check as it was before the index: a scan of every
// prefix of the session. The index must refuse exactly what it refused.
func scanCover(set map[netip.Prefix]struct{}, p netip.Prefix) error {
	above := 0
	for bits := p.Bits() - 1; bits >= 0; bits-- {
		q, _ := p.Addr().Prefix(bits)
		if _, ok := set[q]; ok {
			above++
		}
	}
	if above+1 > MaxCover {
		return ErrCoverTooDeep
	}
	for q := range set {
		if q.Bits() <= p.Bits() || !p.Contains(q.Addr()) || q.Addr().Is4() != p.Addr().Is4() {
			continue
		}
		depth := 1
		for bits := q.Bits() - 1; bits >= 0; bits-- {
			a, _ := q.Addr().Prefix(bits)
			if _, ok := set[a]; ok {
				depth++
			}
		}
		if depth+1 > MaxCover {
			return ErrCoverTooDeep
		}
	}
	return nil
}

// TestCoverIndexMatchesScan: on random nested prefixes (deep enough to hit
// MaxCover), added and removed in random order, the index's check agrees
// with the full scan every time, IPv4 and IPv6.
func TestCoverIndexMatchesScan(t *testing.T) {
	for _, base := range []netip.Prefix{pfx("10.1.0.0/20"), pfx("2001:db8::/116")} {
		rng := rand.New(rand.NewPCG(1, uint64(base.Bits())))
		set := map[netip.Prefix]struct{}{}
		c := newCoverIndex()
		refused, agreed := 0, 0
		for i := 0; i < 6000; i++ {
			// Addresses within base, prefix lengths from base's to exact.
			bl := base.Addr().BitLen()
			raw := base.Addr().As16()
			off := rng.Uint32() & (1<<(bl-base.Bits()) - 1)
			raw[12] |= byte(off >> 24)
			raw[13] |= byte(off >> 16)
			raw[14] |= byte(off >> 8)
			raw[15] |= byte(off)
			a := netip.AddrFrom16(raw)
			if base.Addr().Is4() {
				a = a.Unmap()
				a4 := base.Addr().As4()
				a4[2] |= byte(off >> 8)
				a4[3] |= byte(off)
				a = netip.AddrFrom4(a4)
			}
			bits := base.Bits() + rng.IntN(bl-base.Bits()+1)
			if rng.IntN(3) == 0 {
				bits = bl // many exact entries, as DNS makes
			}
			p, _ := a.Prefix(bits)
			if _, ok := set[p]; ok {
				if rng.IntN(2) == 0 {
					delete(set, p)
					c.remove(p)
				}
				continue
			}
			want, got := scanCover(set, p), c.check(p)
			if (want == nil) != (got == nil) {
				t.Fatalf("%s with %d prefixes: index says %v, scan says %v", p, len(set), got, want)
			}
			agreed++
			if got != nil {
				refused++
				continue
			}
			set[p] = struct{}{}
			c.add(p)
		}
		if refused == 0 || refused == agreed {
			t.Fatalf("%s: %d of %d refused: the cases never reached (or always reached) MaxCover", base, refused, agreed)
		}
		t.Logf("%s: %d checks agree, %d refused, %d prefixes at the end", base, agreed, refused, len(set))
	}
}

// TestAddrSet: the ordered set against a sorted reference.
func TestAddrSet(t *testing.T) {
	var s addrSet
	ref := map[netip.Addr]bool{}
	rng := rand.New(rand.NewPCG(2, 3))
	for i := 0; i < 5000; i++ {
		a := netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(4)), byte(rng.IntN(256))})
		if rng.IntN(3) == 0 {
			s.delete(a)
			delete(ref, a)
		} else {
			s.insert(a)
			ref[a] = true
		}
		q := netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(5)), byte(rng.IntN(256))})
		var want netip.Addr
		for r := range ref {
			if r.Compare(q) >= 0 && (!want.IsValid() || r.Compare(want) < 0) {
				want = r
			}
		}
		got, ok := s.ceil(q)
		if ok != want.IsValid() || (ok && got != want) {
			t.Fatalf("ceil(%s) = %s %v, want %s", q, got, ok, want)
		}
		if s.n != len(ref) {
			t.Fatalf("size %d, want %d", s.n, len(ref))
		}
	}
}

func dnsRule(a string, h HandleRef, exp time.Time) EgressRule {
	return EgressRule{Prefix: netip.PrefixFrom(netip.MustParseAddr(a), 32), Proto: ProtoTCP, Ports: Port(443), Handle: h, Expires: exp}
}

// inKernel reads the exact-address map itself for a.
func inKernel(t testing.TB, d *Dataplane, idx uint32, a string) (shkShkEgressValue, bool) {
	t.Helper()
	var v shkShkEgressValue
	k := key4(idx, netip.PrefixFrom(netip.MustParseAddr(a), 32))
	err := d.objs.ShkExact4.Lookup(&k, &v)
	return v, err == nil
}

// TestDNSEntryCap: a session's DNS-derived entries (rules with an expiry)
// stop at Config.MaxDNSEntries with ErrEntryCap and nothing written; a
// refresh, a second rule on a counted entry and a rule without expiry (a
// grant's) still go in; another session has its own cap.
func TestDNSEntryCap(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxDNSEntries = 8
	d := newDataplane(t, cfg)
	s1, err := d.CreateSession("s1", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateSession("s2", Limits{}); err != nil {
		t.Fatal(err)
	}
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	exp := time.Now().Add(time.Hour)
	for i := range 8 {
		mustAllow(t, d, "s1", dnsRule(fmt.Sprintf("192.0.2.%d", i), h, exp))
	}
	err = d.AllowEgress("s1", dnsRule("192.0.2.100", h, exp))
	if !isErr(err, ErrEntryCap) {
		t.Fatalf("ninth entry: %v, want ErrEntryCap", err)
	}
	if _, ok := inKernel(t, d, s1.Index, "192.0.2.100"); ok {
		t.Fatal("refused entry is in the kernel map")
	}
	mustAllow(t, d, "s1", dnsRule("192.0.2.0", h, exp.Add(time.Hour))) // refresh
	r := dnsRule("192.0.2.1", h, exp)
	r.Ports = Port(80)
	mustAllow(t, d, "s1", r)                                       // second rule on a counted entry
	mustAllow(t, d, "s1", dnsRule("198.51.100.1", h, time.Time{})) // a grant's rule: no expiry
	if err := d.AllowEgress("s1", dnsRule("192.0.2.101", h, exp)); !isErr(err, ErrEntryCap) {
		t.Fatalf("after the others: %v, want ErrEntryCap", err)
	}
	if n, err := d.DNSEntries("s1"); err != nil || n != 8 {
		t.Fatalf("DNSEntries = %d, %v; want 8", n, err)
	}
	for i := range 8 {
		mustAllow(t, d, "s2", dnsRule(fmt.Sprintf("192.0.2.%d", i), h, exp))
	}
	// Removing one frees a place.
	if err := d.RemoveEgress("s1", dnsRule("192.0.2.7", h, exp)); err != nil {
		t.Fatal(err)
	}
	mustAllow(t, d, "s1", dnsRule("192.0.2.100", h, exp))
}

// TestExpiredEntriesCollected: rules past their expiry leave the kernel maps
// within a bounded delay (the collector, every ExpiryInterval, in batches),
// an entry keeps its rules that do not expire, and the cap is freed.
func TestExpiredEntriesCollected(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxDNSEntries = 600
	cfg.ExpiryInterval = 50 * time.Millisecond
	d := newDataplane(t, cfg)
	s, err := d.CreateSession("s1", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	soon := time.Now().Add(400 * time.Millisecond)
	const n = 600 // more than one batch
	for i := range n - 2 {
		mustAllow(t, d, "s1", dnsRule(fmt.Sprintf("10.9.%d.%d", i/256, i%256), h, soon))
	}
	mustAllow(t, d, "s1", dnsRule("10.8.0.1", h, time.Time{}))               // kept: no expiry
	mustAllow(t, d, "s1", withPorts(dnsRule("10.8.0.1", h, soon), Port(80))) // same entry, expires
	mustAllow(t, d, "s1", dnsRule("10.8.0.2", h, time.Now().Add(time.Hour)))
	if err := d.AllowEgress("s1", dnsRule("10.8.0.3", h, soon)); !isErr(err, ErrEntryCap) {
		t.Fatalf("at the cap: %v", err)
	}
	if _, ok := inKernel(t, d, s.Index, "10.9.0.5"); !ok {
		t.Fatal("entry missing before its expiry")
	}
	deadline := soon.Add(time.Second) // expiry + interval + a generous margin for this shared host
	for {
		left := 0
		for i := range n - 2 {
			if _, ok := inKernel(t, d, s.Index, fmt.Sprintf("10.9.%d.%d", i/256, i%256)); ok {
				left++
			}
		}
		if left == 0 {
			t.Logf("all collected %v after expiry", time.Since(soon).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d expired entries still in the map %v after their expiry", left, time.Since(soon))
		}
		time.Sleep(20 * time.Millisecond)
	}
	v, ok := inKernel(t, d, s.Index, "10.8.0.1")
	if !ok || v.Nrules != 1 || v.Rules[0].ExpiresNs != 0 {
		t.Fatalf("mixed entry: present %v, %d rules %+v; want its one rule without expiry", ok, v.Nrules, v.Rules[0])
	}
	if _, ok := inKernel(t, d, s.Index, "10.8.0.2"); !ok {
		t.Fatal("an entry within its TTL was collected")
	}
	if got, _ := d.DNSEntries("s1"); got != 1 {
		t.Fatalf("DNSEntries = %d after collection, want 1", got)
	}
	d.mu.Lock()
	collected, lockMax := d.exp.collected, time.Duration(d.exp.lockMax)
	d.mu.Unlock()
	if collected != n-1 {
		t.Fatalf("collected %d rules, want %d", collected, n-1)
	}
	t.Logf("longest hold of the dataplane lock by one batch: %v", lockMax)
	mustAllow(t, d, "s1", dnsRule("10.8.0.3", h, time.Now().Add(time.Hour)))
}

func withPorts(r EgressRule, p PortRange) EgressRule { r.Ports = p; return r }

// TestDestroyManyEntries: removing a session with 65,000 entries never
// holds the dataplane lock across the purge of its entries: while the
// destroy runs, another session's writes keep taking the lock, and at least
// once, holding it, this test finds the removed session out of the index
// with part of its entries still in the kernel (the deletes go on outside
// the lock; a purge under the lock would leave none by the time the lock is
// free). Every entry is gone afterwards. The waits are logged, not judged:
// wall-clock bounds in a unit test only measure the machine's load.
func TestDestroyManyEntries(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxDNSEntries = 70000
	cfg.MaxEgress4 = 1 << 17
	d := newDataplane(t, cfg)
	a, err := d.CreateSession("big", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateSession("other", Limits{}); err != nil {
		t.Fatal(err)
	}
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	exp := time.Now().Add(time.Hour)
	const n = 65000
	addr := func(i int) string { return fmt.Sprintf("10.%d.%d.%d", 100+i>>16, (i>>8)&255, i&255) }
	start := time.Now()
	for i := range n {
		mustAllow(t, d, "big", dnsRule(addr(i), h, exp))
	}
	t.Logf("%d entries written in %v", n, time.Since(start).Round(time.Millisecond))
	var (
		wg      sync.WaitGroup
		destroy error
		took    time.Duration
	)
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		destroy = d.DestroySession("big")
		took = time.Since(t0)
		close(done)
	}()
	var worst time.Duration
	writes, underway := 0, 0
	for i := 0; ; i++ {
		select {
		case <-done:
		default:
			t0 := time.Now()
			mustAllow(t, d, "other", dnsRule(fmt.Sprintf("10.200.%d.%d", (i>>8)&255, i&255), h, exp))
			worst = max(worst, time.Since(t0))
			writes++
			if purgeUnderway(t, d, a.Index, addr) {
				underway++
			}
			continue
		}
		break
	}
	wg.Wait()
	if destroy != nil {
		t.Fatal(destroy)
	}
	t.Logf("destroy took %v; %d writes of another session meanwhile, the slowest %v; %d times the lock was ours mid-purge", took, writes, worst, underway)
	if underway == 0 {
		t.Fatalf("never held the dataplane lock while the removed session's entries were being purged: the purge holds the lock")
	}
	for _, i := range []int{0, 1, n / 2, n - 1} {
		if _, ok := inKernel(t, d, a.Index, addr(i)); ok {
			t.Fatalf("entry %s of the removed session still in the map", addr(i))
		}
	}
	d.mu.Lock()
	occupied := d.nEntries[1]
	d.mu.Unlock()
	if occupied != writes {
		t.Fatalf("exact IPv4 entries counted %d, want %d (the other session's)", occupied, writes)
	}
}

// purgeUnderway takes d.mu and reports whether the session "big" is out of
// the index while some of its entries (a sample of 256 of the 65,000) are
// still in the kernel.
func purgeUnderway(t *testing.T, d *Dataplane, idx uint32, addr func(int) string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, live := d.sessions["big"]; live {
		return false
	}
	for i := 0; i < 65000; i += 65000 / 256 {
		if _, ok := inKernel(t, d, idx, addr(i)); ok {
			return true
		}
	}
	return false
}

// TestSessionByIndexWithoutLock: the resolver's per-query question (and the
// agent's per-denial one) never waits for the dataplane lock, which bulk
// work of another session may hold; it follows creation and removal.
func TestSessionByIndexWithoutLock(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	s, err := d.CreateSession("named", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	got := make(chan error, 1)
	go func() {
		r, err := d.SessionByIndex(s.Index)
		if err == nil && r.Name != "named" {
			err = fmt.Errorf("name %q", r.Name)
		}
		got <- err
	}()
	select {
	case err := <-got:
		d.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		d.mu.Unlock()
		t.Fatal("SessionByIndex waited for the dataplane lock")
	}
	if err := d.DestroySession("named"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SessionByIndex(s.Index); !isErr(err, ErrSessionNotFound) {
		t.Fatalf("after destroy: %v", err)
	}
}
