package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// BenchmarkGrantMemory: one Auto-tier net.egress grant (a /32 port 443 in
// the test manifest's loopback range) on the memory backend, each to
// another session among 1,000 live ones; -benchmem gives the allocations a
// grant makes (the daemon's GC tail in bench-agent's grant_p99_ms).
func BenchmarkGrantMemory(b *testing.B) {
	m := newMemoryAgentOn(b, memory.MustNew(memory.Config{MaxSessions: 2048, MaxHandles: 1 << 16}))
	const sessions = 2000
	for i := 0; i < sessions; i++ {
		m.session(b, fmt.Sprintf("s%d", i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := i + 1
		addr := netip.AddrFrom4([4]byte{127, 0, 0, byte(1 + n%250)})
		c := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(addr, 32)}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
		m.grant(b, GrantRequest{Session: fmt.Sprintf("s%d", i%sessions), Capability: c})
	}
}

// BenchmarkGrantAuditSync: a grant's wait for its syncs, the live record
// written beside the audit log's fdatasync (CommitBeside) against after
// it (a plain Committer: the log's fdatasync, then the journal's fsync;
// the log's checkpoint trails both), on the memory backend with a real audit log
// and state journal in temporary directories (on this machine's disk when
// TMPDIR is). The two agents alternate grant by grant, so load falls on
// both alike; it reports each one's p50, p90 and p99 in ms.
func BenchmarkGrantAuditSync(b *testing.B) {
	const sessions = 200
	type side struct {
		name string
		m    *memoryAgent
		lat  []time.Duration
	}
	mk := func(name string, beside bool) *side {
		sink := newAuditSink(b, b.TempDir())
		var ev EventSink = sink
		if !beside {
			ev = afterSink{sink}
		}
		m := newMemoryAgentOn(b, memory.MustNew(memory.Config{MaxSessions: 2 * sessions, MaxHandles: 1 << 16}), func(c *Config) { c.Events = ev })
		for i := 0; i < sessions; i++ {
			m.session(b, fmt.Sprintf("s%d", i))
		}
		return &side{name: name, m: m}
	}
	sides := []*side{mk("beside", true), mk("after", false)}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := i + 1
		addr := netip.AddrFrom4([4]byte{127, 0, 0, byte(1 + n%250)})
		c := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(addr, 32)}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
		for j := range sides {
			s := sides[(i+j)%2] // alternate which goes first
			t0 := time.Now()
			s.m.grant(b, GrantRequest{Session: fmt.Sprintf("s%d", i%sessions), Capability: c})
			s.lat = append(s.lat, time.Since(t0))
		}
	}
	b.StopTimer()
	for _, s := range sides {
		slices.Sort(s.lat)
		q := func(p float64) float64 {
			return float64(s.lat[int(p*float64(len(s.lat)-1)+0.5)].Microseconds()) / 1000
		}
		b.ReportMetric(q(0.5), s.name+"_p50_ms")
		b.ReportMetric(q(0.9), s.name+"_p90_ms")
		b.ReportMetric(q(0.99), s.name+"_p99_ms")
	}
}
