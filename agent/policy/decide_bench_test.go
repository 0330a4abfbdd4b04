package policy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkDecide is the agent's decision path with 1,000 sessions × 5
// grants loaded (bench/decision runs the full 10,000-session comparison).
func BenchmarkDecide(b *testing.B) {
	e, err := NewEngine("")
	if err != nil {
		b.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("s%d", i)
		e.PutSession(SessionAttrs{ID: id, Image: "py", TrustTier: "normal", Risk: "normal", TLSInspection: true, Protected: DefaultProtected("/home/x"), PolicyStore: []string{"/etc/shinken"}})
		for j := 0; j < 5; j++ {
			c := egress([]string{fmt.Sprintf("10.%d.%d.0/24", i>>8, i&255)}, []PortRange{{Lo: 443, Hi: 443}})
			if j == 2 {
				c = fsCap([]string{"/work"}, []string{"/work/out"}, nil)
			}
			if err := e.PutGrant(GrantData{ID: fmt.Sprintf("%s-%d", id, j), Session: id, Capability: c, Expires: exp}); err != nil {
				b.Fatal(err)
			}
		}
	}
	reqs := []UseRequest{
		{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("10.0.7.9"), Port: 443},
		{Class: ClassNetEgress, Op: "connect", Domain: "api.github.qkg1.top", Port: 443},
		{Class: ClassFSScope, Op: "write", Path: "/work/out/a/b.txt"},
	}
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := e.Decide("s7", reqs[i%len(reqs)], now); err != nil {
			b.Fatal(err)
		}
	}
}
