package dataplane

import (
	"testing"
	"time"
)

// followSim runs the sweeper's goroutine on a schedule, with sweeps that take no time, and returns the start of every sweep it ran.
func followSim(f *followSchedule) []time.Duration {
	var starts []time.Duration
	for {
		next, ok := f.next()
		if !ok {
			return starts
		}
		starts = append(starts, next)
		f.served(next)
	}
}

// checkServed fails unless each revoke has, for each step, a sweep that
// starts in its window.
func checkServed(t *testing.T, revokes, sweeps []time.Duration) {
	t.Helper()
	for _, r := range revokes {
		for _, st := range followUpSweeps {
			ok := false
			for _, s := range sweeps {
				ok = ok || s >= r+st.after && s <= r+st.after+st.window
			}
			if !ok {
				t.Fatalf("revoke at %v: no sweep starts within %v after %v (sweeps %v)", r, st.window, r+st.after, sweeps)
			}
		}
	}
}

// TestFollowScheduleBurst: a burst of revokes with no sweeps of their own
// (the worst case) gets each of its follow-ups in its window from the
// goroutine, with at most one sweep per window less a grain of any step:
// 24 sweeps for 200 revokes in 100ms, not 600.
func TestFollowScheduleBurst(t *testing.T) {
	ms := time.Millisecond
	f := newFollowSchedule(followUpSweeps)
	var revokes []time.Duration
	for r := 3 * ms; r < 103*ms; r += 500 * time.Microsecond {
		revokes = append(revokes, r)
		f.add(r)
	}
	starts := followSim(&f)
	checkServed(t, revokes, starts)
	// 5ms step: a sweep every 5ms from 12ms to 112ms (21); 100ms step,
	// start times 103ms to 202.5ms rounded up to 20ms: at 200ms and 300ms
	// (2); 1s step: at 2s (1).
	if len(starts) != 24 {
		t.Errorf("200 revokes in 100ms: %d follow-up sweeps, want 24: %v", len(starts), starts)
	}
	for i := 1; i < len(starts); i++ {
		if gap := starts[i] - starts[i-1]; gap < 4*ms {
			t.Errorf("follow-up sweeps at %v and %v: %v apart", starts[i-1], starts[i], gap)
		}
	}
	if _, ok := f.next(); ok {
		t.Errorf("start times left after the sweeps: %v", f.need)
	}
}

// TestFollowScheduleServedBySweeps: while a stream of revokes runs its own
// sweeps at least every 4ms, they serve every follow-up whose window opens
// meanwhile: the goroutine has nothing to do until the stream ends, and
// then runs one or two sweeps per step.
func TestFollowScheduleServedBySweeps(t *testing.T) {
	ms := time.Millisecond
	f := newFollowSchedule(followUpSweeps)
	var revokes, sweeps []time.Duration
	end := 2 * time.Second
	for r := time.Duration(0); r <= end; r += 3 * ms {
		if next, ok := f.next(); ok && next < r {
			t.Fatalf("a follow-up fell due at %v, before the revoke at %v and its sweep", next, r)
		}
		// the revoke's own sweep, then its follow-ups
		sweeps = append(sweeps, r)
		f.served(r)
		revokes = append(revokes, r)
		f.add(r)
	}
	after := followSim(&f)
	checkServed(t, revokes, append(sweeps, after...))
	if len(after) > 5 {
		t.Errorf("after a 2s stream of revokes: %d follow-up sweeps %v", len(after), after)
	}
}

func TestRoundUp(t *testing.T) {
	for _, c := range [][3]time.Duration{{0, 5, 0}, {1, 5, 5}, {5, 5, 5}, {6, 5, 10}, {249, 250, 250}} {
		if got := roundUp(c[0], c[1]); got != c[2] {
			t.Errorf("roundUp(%d, %d) = %d, want %d", c[0], c[1], got, c[2])
		}
	}
}

// TestFollowScheduleBounded: under a steady stream of revokes with no sweeps
// of their own, the goroutine keeps each step's start times to
// (after+window)/grain+1, and runs at most one sweep per window less a grain
// of the shortest step.
func TestFollowScheduleBounded(t *testing.T) {
	f := newFollowSchedule(followUpSweeps)
	var revokes, sweeps []time.Duration
	for r := time.Duration(0); r < 3*time.Second; r += 300 * time.Microsecond {
		for next, ok := f.next(); ok && next <= r; next, ok = f.next() {
			sweeps = append(sweeps, next)
			f.served(next)
		}
		revokes = append(revokes, r)
		f.add(r)
		for i, q := range f.need {
			st := followUpSweeps[i]
			if max := int((st.after+st.window)/st.grain()) + 1; len(q) > max {
				t.Fatalf("at %v step %d holds %d start times, more than %d", r, i, len(q), max)
			}
		}
	}
	sweeps = append(sweeps, followSim(&f)...)
	checkServed(t, revokes, sweeps)
	st := followUpSweeps[0]
	for i := 1; i < len(sweeps); i++ {
		if gap := sweeps[i] - sweeps[i-1]; gap < st.window-st.grain() {
			t.Fatalf("follow-up sweeps at %v and %v", sweeps[i-1], sweeps[i])
		}
	}
	t.Logf("%d revokes in 3s: %d follow-up sweeps", len(revokes), len(sweeps))
}
