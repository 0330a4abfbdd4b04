package dnsresolver

import (
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
)

// slowDataplane delays one session's writes.
type slowDataplane struct {
	*fakeDataplane
	mu      sync.Mutex
	slow    string
	delay   time.Duration
	writing chan struct{} // a slow write began
}

func (d *slowDataplane) AllowEgress(session string, r dataplane.EgressRule) error {
	d.mu.Lock()
	slow, delay := d.slow, d.delay
	d.mu.Unlock()
	if session == slow {
		select {
		case d.writing <- struct{}{}:
		default:
		}
		time.Sleep(delay)
	}
	return d.fakeDataplane.AllowEgress(session, r)
}

// TestWritesOffWorker: with one UDP socket and one worker, a session whose
// answer must wait for slow kernel writes does not hold up another
// session's answer from the cache; the slow answer comes only after its
// entries are written.
func TestWritesOffWorker(t *testing.T) {
	dp := &slowDataplane{fakeDataplane: newFakeDataplane(), writing: make(chan struct{}, 1)}
	var e *testEnv
	e = newTestEnv(t, func(c *Config) {
		c.Dataplane = dp
		c.SessionName = dp.SessionByIndex
		c.UDPWorkers = 1
	})
	dp.sessions[1], dp.sessions[300] = "s1", "s2"
	if err := e.r.SetPolicy("s2", testPolicy); err != nil {
		t.Fatal(err)
	}
	// Cached, and written for s2.
	if resp := e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeSuccess {
		t.Fatal(resp)
	}
	dp.mu.Lock()
	dp.slow, dp.delay = "s1", 600*time.Millisecond
	dp.mu.Unlock()
	slow := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		m := new(dns.Msg)
		m.SetQuestion("api.allowed.test.", dns.TypeA)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, e.r.Port4(1))
		if err != nil || resp.Rcode != dns.RcodeSuccess {
			t.Errorf("slow session: %v %v", resp, err)
		}
		slow <- time.Since(start)
	}()
	<-dp.writing
	for i := range 20 {
		start := time.Now()
		if resp := e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeSuccess {
			t.Fatal(resp)
		}
		// Generous: the slow write takes 600ms.
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("query %d of the other session took %v behind the slow write", i, d)
		}
	}
	if d := <-slow; d < 600*time.Millisecond {
		t.Fatalf("the slow session was answered after %v, before its entry was written", d)
	}
	var s1 int
	for _, w := range dp.take() {
		if w.Session == "s1" {
			s1++
		}
	}
	if s1 != 1 {
		t.Fatalf("%d entries for s1, want 1", s1)
	}
}
