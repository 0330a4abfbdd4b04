package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// BenchmarkCrossingWrite: the one write that crosses the journal's bound,
// at 10,000 sessions with a live grant each (about bench-agent's state),
// against the inline fold it replaced (compact: the whole State encoded
// and written as a snapshot, as the crossing write did until 2026-12-03).
// Reported: crossing_write_ms (the rotation and the append) and
// inline_fold_ms; fold_ms is the background fold's own time.
//
//	go test -run '^$' -bench CrossingWrite -benchtime 5x ./agent/store/
func BenchmarkCrossingWrite(b *testing.B) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	var cross, inline, fold time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := b.TempDir()
		s, err := Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		st := s.State()
		var folded Fold
		s.OnFold = func(f Fold) { folded = f }
		for k := 0; k < 10000; k++ {
			id := fmt.Sprintf("s%d", k)
			st.Sessions[id] = &SessionRecord{Spec: capability.SessionSpec{ID: id, Image: "py"}, Phase: SessionActive, Created: at}
			ref := backend.HandleRef{Slot: uint32(k + 1), Generation: 1}
			gid := fmt.Sprintf("g%d", k)
			st.Grants[gid] = &GrantRecord{ID: gid, Session: id, Capability: capability.Capability{Class: capability.ClassNetEgress,
				Egress: &capability.EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.1.0.1/32")}, Ports: []capability.PortRange{{Lo: 443, Hi: 443}}}},
				Tier: capability.TierAuto, Lifecycle: capability.LifecycleSession, Kernel: ref, Phase: capability.PhaseLive, Created: at,
				Delta: backend.DeltaOf([]backend.EgressRule{{Prefix: netip.MustParsePrefix("127.1.0.1/32"), Proto: backend.ProtoTCP, Ports: backend.PortRange{Lo: 443, Hi: 443}, Handle: ref}})}
		}
		t0 := time.Now()
		if err := s.compact(st); err != nil {
			b.Fatal(err)
		}
		inline += time.Since(t0)
		s.jbytes = max(minCompact, 2*s.sbytes.Load()) // at the bound
		st.Grants["g1"].Phase = capability.PhaseRevoked
		b.StartTimer()
		t1 := time.Now()
		if err := s.Write([]string{GrantKey("g1")}, true); err != nil {
			b.Fatal(err)
		}
		cross += time.Since(t1)
		b.StopTimer()
		s.waitFold()
		if folded.Err != nil || folded.Through != 1 {
			b.Fatalf("fold %+v", folded)
		}
		fold += folded.Took
		s.Close()
	}
	n := float64(b.N)
	b.ReportMetric(float64(cross.Microseconds())/1e3/n, "crossing_write_ms")
	b.ReportMetric(float64(inline.Microseconds())/1e3/n, "inline_fold_ms")
	b.ReportMetric(float64(fold.Microseconds())/1e3/n, "fold_ms")
}

// BenchmarkFold: the background fold of a 4.8 MB snapshot (8,000 revoked
// net.egress grants, as bench-neighbor's grant loop leaves) and a 5.7 MB
// segment (4 lines each for 2,300 more), as the fold does it (raw: records
// kept as their bytes) and as it did until 2026-12-05 (typed: decoded into
// a State and encoded again). Reported: fold_ms, B/op and peak_heap_mib,
// the most heap in use over the heap before, sampled every millisecond.
//
//	go test -run '^$' -bench Fold -benchtime 5x ./agent/store/
func BenchmarkFold(b *testing.B) {
	at := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	tomb := func(k int) *GrantRecord {
		ref := backend.HandleRef{Slot: uint32(k + 1), Generation: 1}
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 1, byte(k >> 8), byte(k)}), 32)
		return &GrantRecord{ID: fmt.Sprintf("%032x", k), Session: "B", Capability: capability.Capability{Class: capability.ClassNetEgress,
			Egress: &capability.EgressScope{CIDRs: []netip.Prefix{p}, Ports: []capability.PortRange{{Lo: 443, Hi: 443}}}},
			Tier: capability.TierAuto, Lifecycle: capability.LifecycleSession, Kernel: ref, Phase: capability.PhaseRevoked, Created: at, Ended: at,
			EndReason: "revoked by operator", Delta: backend.DeltaOf([]backend.EgressRule{{Prefix: p, Proto: backend.ProtoTCP, Ports: backend.PortRange{Lo: 443, Hi: 443}, Handle: ref}})}
	}
	fixture := func(dir string) {
		st := newState()
		st.Sessions["B"] = &SessionRecord{Spec: capability.SessionSpec{ID: "B", Image: "py"}, Phase: SessionActive, Created: at}
		for k := range 8000 {
			g := tomb(k)
			st.Grants[g.ID] = g
		}
		if _, err := writeSnapshot(filepath.Join(dir, "state.json"), st); err != nil {
			b.Fatal(err)
		}
		var seg bytes.Buffer
		for k := 8000; k < 10300; k++ {
			g := tomb(k)
			v, _ := json.Marshal(g)
			for range 4 {
				journalEntry(&seg, GrantKey(g.ID), v)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "state.journal.1"), seg.Bytes(), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	typed := func(s *Store) error {
		st, _, err := readSnapshot(s.path())
		if err != nil {
			return err
		}
		if err := replayFile(s.segPath(1), st.apply); err != nil {
			return err
		}
		migrateLegacy(st)
		st.Through = 1
		_, err = writeSnapshot(s.path(), st)
		return err
	}
	raw := func(s *Store) error { _, err := s.foldThrough(1); return err }
	for _, c := range []struct {
		name string
		fold func(*Store) error
	}{{"raw", raw}, {"typed", typed}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var took time.Duration
			var peak uint64
			for range b.N {
				b.StopTimer()
				dir := b.TempDir()
				fixture(dir)
				runtime.GC()
				var m0 runtime.MemStats
				runtime.ReadMemStats(&m0)
				stop, done := make(chan struct{}), make(chan uint64)
				go func() {
					high := m0.HeapInuse
					for {
						var m runtime.MemStats
						runtime.ReadMemStats(&m)
						high = max(high, m.HeapInuse)
						select {
						case <-stop:
							done <- high
							return
						case <-time.After(time.Millisecond):
						}
					}
				}()
				b.StartTimer()
				t0 := time.Now()
				if err := c.fold(&Store{dir: dir}); err != nil {
					b.Fatal(err)
				}
				took += time.Since(t0)
				b.StopTimer()
				close(stop)
				peak = max(peak, <-done-m0.HeapInuse)
			}
			b.ReportMetric(float64(took.Microseconds())/1e3/float64(b.N), "fold_ms")
			b.ReportMetric(float64(peak)/(1<<20), "peak_heap_mib")
		})
	}
}
