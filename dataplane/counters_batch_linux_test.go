package dataplane

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cilium/ebpf"
)

// TestCountersOfMatchesCounters: the batched read (one BPF_MAP_LOOKUP_BATCH
// per run of near marked indices) gives, for every index and in the
// caller's order, exactly what Counters reads slot by slot: per-CPU values
// summed, runs longer than one batch, gaps, repeats, index 0 (the
// unattributed slot) and the table's last index included, with only the
// written indices marked (sparse runs, gaps read through) and with every
// index marked (runs longer than one batch); an index past the table is
// refused, and an unmarked index is not read.
func TestCountersOfMatchesCounters(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxSessions = 8192 // three batches of countersBatchMax slots
	d := newDataplane(t, cfg)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	// Distinct values in every slot of a spread of indices, on every CPU.
	rng := rand.New(rand.NewPCG(1, 2))
	written := []uint32{0, 1, 2, 3, 100, 2729, 2730, 2731, 4000, 5461, 5462, 8190, 8191}
	for _, idx := range written {
		for r := uint32(0); r < NumReasons; r++ {
			per := make([]uint64, ncpu)
			for c := range per {
				per[c] = rng.Uint64N(1 << 40)
			}
			if err := d.objs.ShkCounters.Update(idx*NumReasons+r, per, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}
		d.markDenied(idx) // as every writer of the counters does
	}
	// A slot written without its mark: CountersOf does not read it (a
	// counter is zero until its session's mark is set).
	const unmarked = 3000
	if err := d.objs.ShkCounters.Update(uint32(unmarked*NumReasons), make([]uint64, ncpu), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	one := make([]uint64, ncpu)
	one[0] = 1
	if err := d.objs.ShkCounters.Update(uint32(unmarked*NumReasons+1), one, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := d.CountersOf([]uint32{unmarked}); err != nil || got[0] != (Denials{}) {
		t.Fatalf("an unmarked index: %v, %v; want zero counts, no read", got, err)
	}
	if err := d.objs.ShkCounters.Update(uint32(unmarked*NumReasons+1), make([]uint64, ncpu), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	all := make([]uint32, cfg.MaxSessions)
	for i := range all {
		all[i] = uint32(i)
	}
	rev := make([]uint32, len(all))
	for i := range rev {
		rev[i] = all[len(all)-1-i]
	}
	for _, marks := range []string{"written marked", "all marked"} {
		if marks == "all marked" {
			for _, idx := range all {
				d.markDenied(idx)
			}
		}
		for name, set := range map[string][]uint32{
			"all":      all,
			"reversed": rev,
			"written":  written,
			"gaps":     {8191, 5, 4000, 2, 2, 0, 2731, 100},
			"one":      {2730},
			"none":     {},
		} {
			got, err := d.CountersOf(set)
			if err != nil {
				t.Fatalf("%s, %s: %v", marks, name, err)
			}
			if len(got) != len(set) {
				t.Fatalf("%s, %s: %d results for %d indices", marks, name, len(got), len(set))
			}
			for i, idx := range set {
				want, err := d.Counters(idx)
				if err != nil {
					t.Fatal(err)
				}
				if got[i] != want {
					t.Fatalf("%s, %s: index %d: batched %v, one by one %v", marks, name, idx, got[i], want)
				}
			}
		}
	}
	if c, _ := d.Counters(4000); c == (Denials{}) {
		t.Fatal("the written counters read as zero: the test compares nothing")
	}
	if _, err := d.CountersOf([]uint32{1, cfg.MaxSessions}); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("index past the table: %v, want ErrSessionNotFound", err)
	}
}

// BenchmarkCountersOf: one scrape's counter read (CountersOf over every
// index) at 100,000 sessions, of which a fraction has denied (its counter
// slots written and marked, spread evenly over the table, the worst case
// for runs).
func BenchmarkCountersOf(b *testing.B) {
	const n = 100000
	cfg := testConfig(b)
	cfg.MaxSessions = n + 1
	d := newDataplane(b, cfg)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		b.Fatal(err)
	}
	all := make([]uint32, n)
	for i := range all {
		all[i] = uint32(i + 1)
	}
	one := make([]uint64, ncpu)
	one[0] = 1
	written := 0
	for _, pct := range []int{0, 1, 10, 100} {
		// Cumulative: each fraction's indices include the smaller one's.
		want := n * pct / 100
		if want > 0 {
			step := n / want
			for i := 0; i < n; i += step {
				idx := uint32(i + 1)
				if err := d.objs.ShkCounters.Update(idx*NumReasons+uint32(ReasonNoRule), one, ebpf.UpdateAny); err != nil {
					b.Fatal(err)
				}
				d.markDenied(idx)
			}
			written = want
		}
		b.Run(fmt.Sprintf("denied=%d%%", pct), func(b *testing.B) {
			for b.Loop() {
				got, err := d.CountersOf(all)
				if err != nil {
					b.Fatal(err)
				}
				if got[0][ReasonNoRule] != uint64(min(written, 1)) {
					b.Fatalf("index 1's no_rule %d", got[0][ReasonNoRule])
				}
			}
		})
	}
}
