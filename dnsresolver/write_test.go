package dnsresolver

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
)

// The kernel writes behind each answer: withheld on failure, rewritten from
// the cache, memoised, and counted in the metrics.

// TestWriteFailure: when the kernel write fails, the answer is withheld.
func TestWriteFailure(t *testing.T) {
	e := newTestEnv(t, nil)
	e.dp.setFail(fmt.Errorf("%w: injected", dataplane.ErrHandleNotLive))
	resp := e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("got %v", resp)
	}
	// A cached answer is not released either.
	resp = e.ask(t, 1, "tcp", "allowed.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("got %v", resp)
	}
	if st := e.r.Stats(); st.Total.WriteErrors != 2 || st.Total.EntriesWritten != 0 {
		t.Fatalf("stats %+v", st.Total)
	}
	e.dp.setFail(nil)
	if resp := e.ask(t, 1, "udp", "allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("after recovery: %v", resp)
	}
}

// TestCacheRewritesEntries: with AlwaysWrite, a cached answer still writes
// its entry (with the original expiry) before it is returned, and does not
// ask the upstream again.
func TestCacheRewritesEntries(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.AlwaysWrite = true })
	first := e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
	n := e.up.queries()
	e1 := e.dp.take()
	time.Sleep(1100 * time.Millisecond)
	second := e.ask(t, 1, "tcp", "api.allowed.test.", dns.TypeA)
	e2 := e.dp.take()
	if e.up.queries() != n {
		t.Fatal("cache miss")
	}
	if len(e1) != 1 || len(e2) != 1 || !e1[0].Rule.Expires.Equal(e2[0].Rule.Expires) {
		t.Fatalf("entries %v then %v", e1, e2)
	}
	if t1, t2 := first.Answer[0].Header().Ttl, second.Answer[0].Header().Ttl; t2 >= t1 {
		t.Fatalf("cached TTL %d not below first TTL %d", t2, t1)
	}
	if e.r.Stats().Sessions["s1"].CacheHits != 1 {
		t.Fatal("cache hit not counted")
	}
}

// TestWriteMemo: by default a cached answer whose entry this resolver
// already wrote (same rule, same expiry) skips the write; a different grant
// or another session writes again, and so does a session whose policy was
// removed and given again. A new policy alone does not: the entry is still
// in the kernel.
func TestWriteMemo(t *testing.T) {
	e := newTestEnv(t, nil)
	e.dp.setSession(2, "s2")
	if err := e.r.SetPolicy("s2", testPolicy); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		do     func()
		writes int
	}{
		{"first answer writes", func() { e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA) }, 1},
		{"cached answer skips", func() { e.ask(t, 1, "tcp", "api.allowed.test.", dns.TypeA) }, 0},
		{"mixed case is the same name", func() { e.ask(t, 1, "udp", "API.allowed.TEST.", dns.TypeA) }, 0},
		{"other session writes", func() { e.ask(t, 2, "udp", "api.allowed.test.", dns.TypeA) }, 1},
		{"SetPolicy keeps what was written", func() {
			if err := e.r.SetPolicy("s1", testPolicy); err != nil {
				t.Fatal(err)
			}
			e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
		}, 0},
		{"RemovePolicy forgets", func() {
			e.r.RemovePolicy("s1")
			if err := e.r.SetPolicy("s1", testPolicy); err != nil {
				t.Fatal(err)
			}
			e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
		}, 1},
		{"s2 still remembered", func() { e.ask(t, 2, "udp", "api.allowed.test.", dns.TypeA) }, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.do()
			if got := e.dp.take(); len(got) != s.writes {
				t.Fatalf("%d writes, want %d: %v", len(got), s.writes, got)
			}
		})
	}
	if st := e.r.Stats(); st.Total.WritesSkipped != 4 || st.Total.EntriesWritten != 3 {
		t.Fatalf("stats %+v", st.Total)
	}
}

func TestWriteMetrics(t *testing.T) {
	e := newTestEnv(t, nil)
	e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)
	e.ask(t, 1, "udp", "notallowed.test.", dns.TypeA)
	e.ask(t, 77, "udp", "allowed.test.", dns.TypeA)
	var b strings.Builder
	if err := e.r.WriteMetrics(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		`shinken_dns_queries_total{session="s1"} 2`,
		`shinken_dns_queries_total{session=""} 1`,
		`shinken_dns_refused_total{session="s1",reason="not_allowed"} 1`,
		`shinken_dns_refused_total{session="",reason="unknown_session"} 1`,
		`shinken_dns_entries_written_total{session="s1"} 1`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "notallowed") {
		t.Error("a query name leaked into the metrics")
	}
}
