package dnsresolver

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkAnswerFast measures the fast path (fast.go) alone: a cached
// allowed name with the entry already written, answered from its prepared
// reply.
func BenchmarkAnswerFast(b *testing.B) {
	e := newTestEnv(b, nil)
	m := new(dns.Msg)
	m.SetQuestion("api.allowed.test.", dns.TypeA)
	raw, _ := m.Pack()
	local := SessionAddr(1)
	e.r.handleRaw(local, "udp", raw)
	var s fastScratch
	out := make([]byte, 0, fastMaxReply)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := e.r.answerFast(&s, local.As4(), raw, time.Now(), out); !ok {
			b.Fatal("no fast reply")
		}
	}
}

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
