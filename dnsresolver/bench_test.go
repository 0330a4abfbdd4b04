package dnsresolver

import (
	"testing"

	"github.com/miekg/dns"
)

// BenchmarkHandleRaw measures the per-query CPU of the handler alone (no
// sockets): a cached allowed name with the entry already written, and a
// refused name.
func BenchmarkHandleRaw(b *testing.B) {
	e := newTestEnv(b, nil)
	for _, bc := range []struct{ name, qname string }{
		{"allowed-cached", "api.allowed.test."},
		{"refused", "notallowed.test."},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := new(dns.Msg)
			m.SetQuestion(bc.qname, dns.TypeA)
			raw, _ := m.Pack()
			local := SessionAddr(1)
			e.r.handleRaw(local, "udp", raw)
			b.ReportAllocs()
			for b.Loop() {
				if e.r.handleRaw(local, "udp", raw) == nil {
					b.Fatal("no reply")
				}
			}
		})
	}
}
