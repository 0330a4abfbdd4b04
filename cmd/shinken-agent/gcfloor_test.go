package main

import "testing"

func TestGCPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 100},         // not known yet
		{3 * mib, 966},   // 3 MiB live: goal 32 MiB
		{16 * mib, 100},  // live × 2 reaches the floor: the default
		{100 * mib, 100}, // a large daemon: the default
		{200 * mib, 50},  // above gcLarge: goal 1.5 × live
		{1024, 10000},    // capped
	} {
		if got := gcPercent(c.live, 32*mib); got != c.want {
			t.Errorf("gcPercent(%d) = %d, want %d", c.live, got, c.want)
		}
		// the goal reaches the floor (to rounding) where the floor is above it
		if pct := gcPercent(c.live, 32*mib); c.live > 0 && pct > 100 && pct < 10000 {
			if goal := c.live * uint64(100+pct) / 100; goal < 32*mib-c.live {
				t.Errorf("live %d: goal %d below the floor", c.live, goal)
			}
		}
	}
}
