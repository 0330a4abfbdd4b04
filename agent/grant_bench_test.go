package agent

import (
	"fmt"
	"net/netip"
	"testing"

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
