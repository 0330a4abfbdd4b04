package dnsresolver

import (
	"fmt"
	"testing"
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
	c.put("s15", &fastEntry{session: "s3"})
	c.bySession["s1"] = map[string]struct{}{"s15": {}}
	c.forget("s1")
	if e := c.get([]byte("s15")); e == nil || e.session != "s3" {
		t.Fatal("forgetting s1 dropped s3's reply")
	}
	// The bound still empties both when full.
	for i := range decMemoSize {
		d.put("s3", decKey{name: fmt.Sprint("m", i)}, decAnswer{})
	}
	if d.n > decMemoSize || d.n != len(d.memo["s3"])+len(d.memo["s2"]) {
		t.Fatalf("%d decisions counted, %d held", d.n, len(d.memo["s3"])+len(d.memo["s2"]))
	}
}
