package dnsresolver

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// offsetClock is a clock the test can move forward, safe for concurrent use.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) now() time.Time      { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) add(d time.Duration) { c.off.Add(int64(d)) }

// TestRefusedRaw: the REFUSED reply built from a query's bytes is what the
// full path's would be, OPT aside.
func TestRefusedRaw(t *testing.T) {
	for _, edns := range []bool{false, true} {
		m := new(dns.Msg)
		m.SetQuestion("Some.Name.test.", dns.TypeAAAA)
		m.Id, m.CheckingDisabled = 0xbeef, true
		if edns {
			m.SetEdns0(4096, true)
		}
		raw, _ := m.Pack()
		out, ok := refusedRaw(raw, nil)
		if !ok {
			t.Fatal("no reply")
		}
		got := new(dns.Msg)
		if err := got.Unpack(out); err != nil {
			t.Fatal(err)
		}
		if !got.Response || got.Id != m.Id || got.Rcode != dns.RcodeRefused || !got.RecursionDesired || !got.RecursionAvailable ||
			!got.CheckingDisabled || got.Truncated || len(got.Question) != 1 || got.Question[0] != m.Question[0] || len(got.Extra) != 0 {
			t.Fatalf("reply %v", got)
		}
	}
	for _, raw := range [][]byte{nil, make([]byte, 11), {0, 1, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, ok := refusedRaw(raw, nil); ok {
			t.Fatalf("reply to %x", raw)
		}
	}
	// A question cut short, or compressed: the header alone.
	out, ok := refusedRaw([]byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 1, 0, 1}, nil)
	if got := new(dns.Msg); !ok || got.Unpack(out) != nil || len(got.Question) != 0 || got.Rcode != dns.RcodeRefused {
		t.Fatalf("%x", out)
	}
}

// TestQueryRate: a session over its query rate is answered REFUSED
// (reason rate), counted, reported once a second, over UDP and TCP; another
// session is not touched. Sending QueryRate queries over the rate within a
// second puts the session in the penalty box: its queries over the rate then
// get no reply, until penaltyHold after the last.
func TestQueryRate(t *testing.T) {
	clk := &offsetClock{}
	e := newTestEnv(t, func(c *Config) { c.QueryRate, c.QueryBurst, c.now = 10, 20, clk.now })
	if err := e.r.SetPolicy("s2", testPolicy); err != nil {
		t.Fatal(err)
	}
	answered, refused := 0, 0
	for range 25 {
		switch rc := e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA).Rcode; rc {
		case dns.RcodeSuccess:
			answered++
		case dns.RcodeRefused:
			refused++
		default:
			t.Fatalf("rcode %s", dns.RcodeToString[rc])
		}
	}
	if answered < 20 || answered > 22 || refused != 25-answered {
		t.Fatalf("%d answered, %d refused; want the burst of 20 (and a token or two) answered", answered, refused)
	}
	if rc := e.ask(t, 1, "tcp", "api.allowed.test.", dns.TypeA).Rcode; rc != dns.RcodeRefused {
		t.Fatalf("tcp over the rate: %s", dns.RcodeToString[rc])
	}
	refused++
	if rc := e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA).Rcode; rc != dns.RcodeSuccess {
		t.Fatalf("other session: %s", dns.RcodeToString[rc])
	}
	st := e.r.Stats()
	if got := st.Sessions["s1"].Denials[ReasonRate]; got != uint64(refused) || st.Sessions["s2"].Denials[ReasonRate] != 0 || st.Total.Denials[ReasonRate] != uint64(refused) {
		t.Fatalf("rate denials: s1 %d (want %d), s2 %d", got, refused, st.Sessions["s2"].Denials[ReasonRate])
	}
	var reported int
	for _, d := range e.den.take() {
		if d.Reason == ReasonRate {
			reported++
			if d.Session != "s1" || d.Index != 1 {
				t.Fatalf("denial %+v", d)
			}
		}
	}
	if reported != 1 {
		t.Fatalf("%d rate denials reported, want 1", reported)
	}
	if len(e.r.Penalised()) != 0 {
		t.Fatalf("penalised %v after %d over the rate", e.r.Penalised(), refused)
	}

	// Flooding: QueryRate over the rate within the second.
	if got := burst(t, e.r.Port4(1), 10); got == 10 {
		t.Fatal("every query of the flood answered")
	}
	if p := e.r.Penalised(); len(p) != 1 || p[0] != 1 {
		t.Fatalf("penalised %v, want [1]", p)
	}
	// In the box, queries over the rate get no reply: the resolver drops
	// them, or the kernel before it (steer_linux.go; counted by the next
	// sweep).
	dropped := func() uint64 { c := e.r.Stats().Sessions["s1"]; return c.RateDropped + c.KernelDropped }
	before := dropped()
	if got := burst(t, e.r.Port4(1), 30); got > 12 {
		t.Fatalf("%d of 30 answered in the box", got)
	}
	for deadline := time.Now().Add(2 * time.Second); dropped() < before+18 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if after := dropped(); after < before+18 {
		t.Fatalf("RateDropped+KernelDropped %d -> %d", before, after)
	}
	// The metrics say so per session.
	var b strings.Builder
	if err := e.r.WriteMetrics(&b); err != nil {
		t.Fatal(err)
	}
	st = e.r.Stats()
	for _, want := range []string{
		fmt.Sprintf(`shinken_dns_refused_total{session="s1",reason="rate"} %d`, st.Sessions["s1"].Denials[ReasonRate]),
		fmt.Sprintf(`shinken_dns_rate_dropped_total{session="s1"} %d`, st.Sessions["s1"].RateDropped),
		`shinken_dns_rate_dropped_total{session="s2"} 0`,
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Within the rate again (tokens back), it is answered, from the box.
	clk.add(3 * time.Second)
	if rc := e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA).Rcode; rc != dns.RcodeSuccess {
		t.Fatalf("in the box, within the rate: %s", dns.RcodeToString[rc])
	}
	// penaltyHold after the last query over the rate, it is out.
	clk.add(penaltyHold)
	deadline := time.Now().Add(5 * time.Second)
	for len(e.r.Penalised()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still penalised: %v", e.r.Penalised())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWriteRate: an answer needing more entry writes than the session has
// tokens for is withheld (SERVFAIL, WriteLimited) and writes nothing; one
// needing none (the entries are written) still goes out; the first answer
// may take more than the burst from a full bucket.
func TestWriteRate(t *testing.T) {
	clk := &offsetClock{}
	e := newTestEnv(t, func(c *Config) { c.WriteRate, c.WriteBurst, c.now = 1, 5, clk.now })
	resp := e.ask(t, 1, "udp", "many.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeSuccess || len(e.dp.take()) != DefaultMaxAnswerRecords {
		t.Fatalf("first answer: %v", resp)
	}
	if resp := e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("over the write rate: %v", resp)
	}
	if got := e.dp.take(); len(got) != 0 {
		t.Fatalf("wrote %v", got)
	}
	if resp := e.ask(t, 1, "tcp", "many.test.", dns.TypeA); resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("entries already written: %v", resp)
	}
	if st := e.r.Stats().Sessions["s1"]; st.WriteLimited != 1 || st.EntriesWritten != uint64(DefaultMaxAnswerRecords) {
		t.Fatalf("stats %+v", st)
	}
	// The debt paid (16 tokens at 1/s), it writes again.
	clk.add(20 * time.Second)
	if resp := e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeSuccess || len(e.dp.take()) != 1 {
		t.Fatalf("after refill: %v", resp)
	}
}

// burst sends n queries for api.allowed.test to addr at once from one
// socket and counts the replies that come within 300ms.
func burst(t *testing.T, addr string, n int) int {
	t.Helper()
	c, err := net.Dial("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("api.allowed.test.", dns.TypeA)
	for i := range n {
		m.Id = uint16(i)
		b, _ := m.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	buf := make([]byte, 1500)
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	for {
		if _, err := c.Read(buf); err != nil {
			return got
		}
		got++
	}
}
