package main

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
)

// The daemon's live heap is small with few sessions (about 3 MiB at 100),
// and Go's default GC (GOGC=100, a 4 MiB minimum goal) then runs a cycle
// every ~100 ms under a stream of API requests: on a 2-core host its mark
// phase and assists land in the API's tail (bench-decision: POST /v1/decide
// p99 roughly halved with GC off). gcFloor raises GOGC so the heap goal is
// at least gcFloorBytes, and goes back to 100 once the live heap is large
// enough (at 10,000 sessions it is): memory grows to the floor at most, never
// beyond what GOGC=100 would allow above it. Above gcLarge of live heap it
// sets GOGC 50. An operator's GOGC is left alone.
const gcFloorBytes = 32 << 20

type gcTuner struct {
	floor  uint64
	last   int
	sample []metrics.Sample
}

func newGCTuner(floor uint64) *gcTuner {
	if os.Getenv("GOGC") != "" {
		return nil
	}
	return &gcTuner{floor: floor, last: 100, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
}

// tune sets GOGC from the live heap; call it periodically (every second).
func (g *gcTuner) tune() {
	if g == nil {
		return
	}
	metrics.Read(g.sample)
	if g.sample[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	if pct := gcPercent(g.sample[0].Value.Uint64(), g.floor); pct != g.last {
		debug.SetGCPercent(pct)
		g.last = pct
	}
}

// gcLarge is the live heap above which the goal is 1.5 × live, not twice
// it (GOGC 50): at 100,000 sessions the live heap is about 200 MiB and the
// default doubling, with the idle memory the runtime keeps after a burst,
// held the daemon's RSS at 600–680 MiB (bench/README.md, bench-scale).
// Below it a collection costs little and the API's tail is what matters.
const gcLarge = 128 << 20

// gcPercent is the GOGC that puts the heap goal, live × (1 + GOGC/100), at
// floor, and never below 100 nor above 10,000 (live bytes of 0: not known
// yet); 50 once the live heap is above gcLarge.
func gcPercent(live, floor uint64) int {
	if live >= gcLarge {
		return 50
	}
	if live == 0 || live*2 >= floor {
		return 100
	}
	pct := floor*100/live - 100
	return int(min(pct, 10000))
}
