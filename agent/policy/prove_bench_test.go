package policy

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkProveGrant: the grant proof of one net.egress /32 on port 443,
// another address each time (as bench-agent's grants ask): its CPU and
// allocations are most of what a grant costs the agent beside its syncs.
func BenchmarkProveGrant(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		n := i + 1
		addr := netip.AddrFrom4([4]byte{127, byte(1 + n>>16), byte(n >> 8), byte(n)})
		g := GrantData{ID: "g", Session: fmt.Sprintf("s%d", i%1000), Capability: egress([]string{netip.PrefixFrom(addr, 32).String()}, []PortRange{{Lo: 443, Hi: 443}})}
		if err := ProveGrant(g, t0); err != nil {
			b.Fatal(err)
		}
	}
}
