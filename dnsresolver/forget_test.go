package dnsresolver

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestForgetSession: the prepared replies and the remembered decisions
// forget one session (at each change of its policy) without touching
// another's, and keep their counts right for their bounds.
func TestForgetSession(t *testing.T) {
	d := &decider{}
	c := newFastCache(1 << 10)
	for i := range 100 {
		for _, s := range []string{"s1", "s2"} {
			d.put(s, decKey{name: fmt.Sprint("n", i), port: 443}, decAnswer{ok: true})
			c.put(s+fmt.Sprint(i), &fastEntry{session: s})
		}
	}
	d.forget("s1")
	c.forget("s1")
	if d.n != 100 || len(d.memo["s1"]) != 0 || len(d.memo["s2"]) != 100 {
		t.Fatalf("decisions after forgetting s1: %d counted, s1 %d, s2 %d; want 100, 0, 100", d.n, len(d.memo["s1"]), len(d.memo["s2"]))
	}
	if a, ok := d.get("s2", decKey{name: "n7", port: 443}); !ok || !a.ok {
		t.Fatal("s2's decision is gone")
	}
	if len(c.m) != 100 || len(c.bySession["s1"]) != 0 || c.get([]byte("s27")) == nil || c.get([]byte("s17")) != nil {
		t.Fatalf("prepared replies after forgetting s1: %d left, s1's keys %d", len(c.m), len(c.bySession["s1"]))
	}
	// A key s1 had and s3 took since (a new session at the same index)
	// is s3's: forgetting s1 leaves it.
	c.put("s16", &fastEntry{session: "s1"})
	c.put("s16", &fastEntry{session: "s3"})
	if _, ok := c.bySession["s1"]["s16"]; ok {
		t.Fatal("s1 still counts the key s3 took")
	}
	c.forget("s1")
	if e := c.get([]byte("s16")); e == nil || e.session != "s3" {
		t.Fatal("forgetting s1 dropped s3's reply")
	}
	// A full table forgets the session that filled it, not the others.
	for i := range decMemoSize + 10 {
		d.put("s3", decKey{name: fmt.Sprint("m", i)}, decAnswer{})
	}
	if d.n > decMemoSize || d.n != len(d.memo["s3"])+len(d.memo["s2"]) {
		t.Fatalf("%d decisions counted, %d held", d.n, len(d.memo["s3"])+len(d.memo["s2"]))
	}
	if len(d.memo["s2"]) != 100 {
		t.Fatalf("s2 kept %d of its 100 decisions while s3 filled the memo", len(d.memo["s2"]))
	}
	for i := range 1<<10 + 10 {
		c.put(fmt.Sprint("f", i), &fastEntry{session: "s3"})
	}
	if len(c.m) > 1<<10 || len(c.bySession["s2"]) != 100 || c.get([]byte("s27")) == nil {
		t.Fatalf("prepared replies after s3 filled the cache: %d held, s2 kept %d of 100", len(c.m), len(c.bySession["s2"]))
	}
}

// TestAnswerCacheFull: a full answer cache drops the expired answers first,
// then those fetched by the sessions that fetched the most: a session
// fetching distinct names evicts its own answers, not another's.
func TestAnswerCacheFull(t *testing.T) {
	now := time.Unix(2_000_000_000, 0)
	c := newCache(100)
	live := &result{expires: now.Add(time.Hour)}
	for i := range 20 {
		c.put(cacheKey{fmt.Sprint("b", i), 1}, live, "b", now)
	}
	for i := range 5 {
		c.put(cacheKey{fmt.Sprint("old", i), 1}, &result{expires: now.Add(-time.Second)}, "c", now)
	}
	for i := range 1000 {
		c.put(cacheKey{fmt.Sprint("a", i), 1}, live, "a", now)
		if len(c.m) > 100 {
			t.Fatalf("%d answers over a bound of 100", len(c.m))
		}
	}
	for i := range 20 {
		if c.get(cacheKey{fmt.Sprint("b", i), 1}, now) == nil {
			t.Fatalf("b's answer %d evicted while a filled the cache", i)
		}
	}
	if len(c.byOwner["c"]) != 0 {
		t.Fatal("expired answers outlived a full cache")
	}
	held := 0
	for _, keys := range c.byOwner {
		held += len(keys)
	}
	if held != len(c.m) {
		t.Fatalf("owners count %d answers, %d held", held, len(c.m))
	}
	// An answer fetched again by another session is that session's.
	c.put(cacheKey{"b0", 1}, live, "a", now)
	if _, ok := c.byOwner["b"][cacheKey{"b0", 1}]; ok || len(c.byOwner["b"]) != 19 {
		t.Fatal("b still counts the answer a fetched again")
	}
}

// TestWriteMemoFull: a full memo forgets the sessions holding the most
// first, down to three quarters of its bound at once (one walk of the
// sessions for a quarter of the adds, however many sessions hold a few
// entries each), and keeps its count right.
func TestWriteMemoFull(t *testing.T) {
	w := newWriteMemo(100)
	rule := func(i int) backend.EgressRule {
		return backend.EgressRule{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, byte(i >> 8), byte(i)}), 32), Expires: time.Unix(2_000_000_000, 0)}
	}
	for i := range 40 {
		w.add("big", rule(i))
	}
	small := 0
	for ; w.n < 100; small++ {
		w.add(fmt.Sprint("s", small), rule(small))
	}
	gen := w.gen("s0")
	w.add("one-more", rule(0))
	held := 0
	for _, sw := range w.s {
		held += len(sw.m)
	}
	if w.s["big"] != nil || w.n != held || w.n > 75 || w.n < 60 {
		t.Fatalf("after filling: big kept %v, %d counted, %d held; want big forgotten, 60 to 75", w.s["big"] != nil, w.n, held)
	}
	if w.gen("s0") != gen || !w.has("s0", rule(0)) {
		t.Fatal("a small session lost its part although the big one made room")
	}
	room := 100 - w.n // at least a quarter: filled without another walk, nothing dropped
	if room < 25 {
		t.Fatalf("room for %d after the walk", room)
	}
	for i := range room {
		w.add(fmt.Sprint("t", i), rule(i))
		if w.gen("s0") != gen {
			t.Fatalf("s0 dropped at the %d-th add after the walk", i+1)
		}
		if w.n > 100 {
			t.Fatalf("%d entries over a bound of 100", w.n)
		}
	}
	// Many sessions of one entry each, none larger: one walk still makes
	// a quarter of room.
	w = newWriteMemo(100)
	for i := range 100 {
		w.add(fmt.Sprint("u", i), rule(i))
	}
	w.add("last", rule(0))
	if w.n > 76 || w.n != len(w.s) { // three quarters, then the entry added
		t.Fatalf("a full memo of single entries: %d counted, %d parts after the walk and the add; want at most 76", w.n, len(w.s))
	}
}

// TestPolicyEqual: Equal tells every field of every grant, their order and
// the deny patterns apart.
func TestPolicyEqual(t *testing.T) {
	base := func() Policy {
		return Policy{
			Grants: []Grant{
				{Pattern: "a.test", Handle: backend.HandleRef{Slot: 1, Generation: 1}, Proto: backend.ProtoTCP, Ports: backend.PortRange{Lo: 443, Hi: 443}, AllowNonPublic: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
				{Pattern: "*.b.test", Handle: backend.HandleRef{Slot: 2, Generation: 1}},
			},
			Deny: []string{"x.a.test"},
		}
	}
	if !base().Equal(base()) || !(Policy{}).Equal(Policy{}) {
		t.Fatal("equal policies compare unequal")
	}
	for name, change := range map[string]func(p *Policy){
		"pattern":        func(p *Policy) { p.Grants[0].Pattern = "c.test" },
		"handle":         func(p *Policy) { p.Grants[0].Handle.Generation = 2 },
		"proto":          func(p *Policy) { p.Grants[0].Proto = backend.ProtoUDP },
		"ports":          func(p *Policy) { p.Grants[0].Ports.Hi = 444 },
		"non-public":     func(p *Policy) { p.Grants[0].AllowNonPublic = nil },
		"order":          func(p *Policy) { p.Grants[0], p.Grants[1] = p.Grants[1], p.Grants[0] },
		"one grant less": func(p *Policy) { p.Grants = p.Grants[:1] },
		"deny":           func(p *Policy) { p.Deny = nil },
		"another deny":   func(p *Policy) { p.Deny = []string{"y.a.test"} },
	} {
		p := base()
		change(&p)
		if p.Equal(base()) || base().Equal(p) {
			t.Errorf("%s: a changed policy compares equal", name)
		}
	}
}
