package dataplane

import (
	"slices"
	"time"
)

// Follow-up sweeps after each revoke. A connect() allowed just before a
// revoke finishes connecting outside the connect hook, so the sweep that
// follows the map write can run before its socket is hashed (TCP) or has a
// peer (UDP); these later sweeps find it and destroy it. A TCP connection in
// that window can be established until then: sweep mode runs no program on
// its packets (the SYN-ACK check of cgroup_skb/ingress it once had ran on
// every packet of every session flow; bench/README).
//
// Each step asks, for a revoke at r, for one sweep that starts between
// r+after and r+after+window. Any sweep serves it: a later revoke's own
// sweep, a deadline's, or one the sweeper's goroutine runs (flows_linux.go)
// when the window is about to close with none. That goroutine runs as late
// as the window allows, and its sweep serves every revoke whose step it
// starts after, so a burst of revokes shares its follow-ups: while the
// burst's own sweeps come often enough they serve them all, and afterwards
// the goroutine runs at most one sweep per window less a grain of each step
// (4ms, 80ms, 800ms), however many revokes the burst held. Each window is as
// long as its delay: the later steps are a safety net, and a sweep walks
// every socket of the host.
var followUpSweeps = []followUpStep{
	{after: 5 * time.Millisecond, window: 5 * time.Millisecond},
	{after: 100 * time.Millisecond, window: 100 * time.Millisecond},
	{after: time.Second, window: time.Second},
}

type followUpStep struct{ after, window time.Duration }

// followGrains: a step's start times are rounded up to window/followGrains
// (its grain), so that it holds one per grain of the revokes not served yet:
// with the goroutine running, at most (after+window)/grain+1 (11). A sweep
// is then due a window less one grain after the rounded time, which is still
// within the window of every revoke rounded up to it.
const followGrains = 5

func (st followUpStep) grain() time.Duration { return st.window / followGrains }

// followSchedule holds, per step, the earliest start times the follow-ups
// not served yet need, as offsets from the sweeper's start (monotonic
// clock), rounded up to the step's grain, ascending and without repeats. It
// is not safe for concurrent use.
type followSchedule struct {
	steps []followUpStep
	need  [][]time.Duration
}

func newFollowSchedule(steps []followUpStep) followSchedule {
	return followSchedule{steps: steps, need: make([][]time.Duration, len(steps))}
}

// add asks for every step's follow-up after a revoke at now.
func (f *followSchedule) add(now time.Duration) {
	for i, st := range f.steps {
		t := roundUp(now+st.after, st.grain())
		if j, found := slices.BinarySearch(f.need[i], t); !found {
			f.need[i] = slices.Insert(f.need[i], j, t)
		}
	}
}

// next returns when a sweep must start at the latest to serve every
// follow-up in its window, if any is pending.
func (f *followSchedule) next() (time.Duration, bool) {
	var (
		first time.Duration
		ok    bool
	)
	for i, q := range f.need {
		if len(q) == 0 {
			continue
		}
		st := f.steps[i]
		if d := q[0] + st.window - st.grain(); !ok || d < first {
			first, ok = d, true
		}
	}
	return first, ok
}

// served drops every follow-up a sweep that started at start serves.
func (f *followSchedule) served(start time.Duration) {
	for i, q := range f.need {
		n := 0
		for n < len(q) && q[n] <= start {
			n++
		}
		f.need[i] = slices.Delete(q, 0, n)
	}
}

func roundUp(t, step time.Duration) time.Duration {
	if r := t % step; r != 0 {
		return t + step - r
	}
	return t
}
