package store

import (
	"fmt"
	"net/netip"
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
