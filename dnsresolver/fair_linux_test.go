package dnsresolver

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// TestWritesOffWorker: with one UDP socket (both sessions on it) and one
// worker, a session whose
// answer must wait for slow kernel writes does not hold up another
// session's answer from the cache; the slow answer comes only after its
// entries are written.
func TestWritesOffWorker(t *testing.T) {
	dp := &slowDataplane{fakeDataplane: newFakeDataplane(), writing: make(chan struct{}, 1)}
	var e *testEnv
	e = newTestEnv(t, func(c *Config) {
		c.Dataplane = dp
		c.SessionName = dp.SessionByIndex
		c.UDPSockets, c.UDPWorkers = 1, 1
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

// TestSteering: each session's datagrams reach socket (session address mod
// UDPSockets), and a session in the penalty box's reach the penalty socket.
func TestSteering(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.UDPSockets = 4 })
	if e.r.udp.steering == nil {
		t.Fatal("steering program not attached")
	}
	for idx := uint32(1); idx <= 8; idx++ {
		e.dp.setSession(idx, fmt.Sprintf("x%d", idx))
	}
	send := func(idx uint32) []uint64 {
		before := e.r.udp.received()
		e.ask(t, idx, "udp", "api.allowed.test.", dns.TypeA)
		after := e.r.udp.received()
		for i := range after {
			after[i] -= before[i]
		}
		return after
	}
	for idx := uint32(1); idx <= 8; idx++ {
		want := make([]uint64, 5)
		want[(sessionBase+idx)%4] = 1
		if got := send(idx); !slices.Equal(got, want) {
			t.Fatalf("session %d: received %v, want %v", idx, got, want)
		}
	}
	e.r.box.add(6, time.Now().UnixNano())
	e.r.limits.session(6).excess.Store(time.Now().UnixNano())
	if got := send(6); !slices.Equal(got, []uint64{0, 0, 0, 0, 1}) {
		t.Fatalf("penalised session: received %v", got)
	}
	if got := send(5); !slices.Equal(got, []uint64{0, 1, 0, 0, 0}) {
		t.Fatalf("session 5: received %v", got)
	}
}

// TestFlood: one session floods the resolver with distinct names it may not
// resolve, from several sockets, as fast as the test can send; another
// session, on the same UDP socket (UDPSockets 1) or on the default sockets,
// keeps getting every answer, each within a generous bound (the flood's
// senders share the CPUs). The
// flooder ends in the penalty box, its excess counted.
func TestFlood(t *testing.T) {
	for _, socks := range []int{1, 0} {
		t.Run(fmt.Sprintf("sockets=%d", socks), func(t *testing.T) {
			e := newTestEnv(t, func(c *Config) { c.UDPSockets = socks })
			if err := e.r.SetPolicy("s2", testPolicy); err != nil {
				t.Fatal(err)
			}
			e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA) // cached, written
			stop := make(chan struct{})
			var flood sync.WaitGroup
			var sent atomic.Uint64
			for g := range 2 {
				flood.Go(func() {
					c, err := net.Dial("udp4", e.r.Port4(1))
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					m := new(dns.Msg)
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						m.SetQuestion(fmt.Sprintf("f%d-%d.notallowed.test.", g, i), dns.TypeA)
						b, _ := m.Pack()
						if _, err := c.Write(b); err == nil {
							sent.Add(1)
						}
					}
				})
			}
			began := time.Now()
			time.Sleep(200 * time.Millisecond) // the flood is on
			var worst time.Duration
			lost := 0
			c := &dns.Client{Net: "udp", Timeout: time.Second}
			m := new(dns.Msg)
			m.SetQuestion("api.allowed.test.", dns.TypeA)
			for range 100 {
				start := time.Now()
				resp, _, err := c.Exchange(m, e.r.Port4(300))
				if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
					lost++
					continue
				}
				worst = max(worst, time.Since(start))
				time.Sleep(5 * time.Millisecond)
			}
			close(stop)
			flood.Wait()
			secs := uint64(time.Since(began)/time.Second) + 1
			st := e.r.Stats()
			a, b := st.Sessions["s1"], st.Sessions["s2"]
			t.Logf("flood sent %d; s1: %d queries, %d refused for rate, %d dropped, %d not_allowed; s2 worst %v", sent.Load(), a.Queries, a.Denials[ReasonRate], a.RateDropped, a.Denials[ReasonNotAllowed], worst)
			if lost != 0 {
				t.Fatalf("the other session lost %d of 100 queries", lost)
			}
			if worst > 500*time.Millisecond {
				t.Fatalf("the other session's slowest answer took %v", worst)
			}
			// Fully handled: the burst and the rate, no more.
			if a.RateDropped == 0 || a.Denials[ReasonNotAllowed] > DefaultQueryBurst+secs*DefaultQueryRate {
				t.Fatalf("flooder: %d dropped, %d fully handled", a.RateDropped, a.Denials[ReasonNotAllowed])
			}
			if b.Denials[ReasonRate] != 0 || b.RateDropped != 0 {
				t.Fatalf("the other session was limited: %+v", b)
			}
		})
	}
}

// TestKernelDrops: a session in the penalty box that floods gets at most
// its rate per window through to the penalty socket; the steering program
// sends the rest to the sink and counts them (Counters.KernelDropped, the
// metric), with no ICMP error back to the sender; a flooder whose queries
// the kernel drops stays in the box; another session is not touched; and
// once out of the box the session's queries reach its own socket again,
// with the drops of its last moments in the box still counted.
func TestKernelDrops(t *testing.T) {
	const rate = 100
	e := newTestEnv(t, func(c *Config) { c.UDPSockets, c.QueryRate, c.QueryBurst = 2, rate, rate })
	if e.r.udp.steering == nil {
		t.Fatal("steering program not attached")
	}
	if err := e.r.SetPolicy("s2", testPolicy); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	e.r.box.add(1, now)
	entered := now - int64(4*time.Second)
	e.r.limits.session(1).excess.Store(entered)

	c, err := net.Dial("udp4", e.r.Port4(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("f.notallowed.test.", dns.TypeA)
	q, _ := m.Pack()
	before := e.r.udp.received()
	const sent = 20000
	start := time.Now()
	for i := range sent {
		if _, err := c.Write(q); err != nil {
			t.Fatalf("send %d: %v (an ICMP error from a dropped datagram?)", i, err)
		}
	}
	elapsed := time.Since(start)
	// maintain counts the drops every sweepInterval.
	deadline := time.Now().Add(3 * time.Second)
	for e.r.Stats().Sessions["s1"].KernelDropped == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * sweepInterval)
	after := e.r.udp.received()
	penalty := after[2] - before[2]
	windows := uint64(elapsed/steerWindow) + 2
	dropped := e.r.Stats().Sessions["s1"].KernelDropped
	t.Logf("sent %d in %v: %d read on the penalty socket, %d dropped in the kernel, %v to the others", sent, elapsed, penalty, dropped, after[:2])
	if after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("a penalised session's datagrams reached the group's sockets: %v -> %v", before, after)
	}
	if penalty == 0 || penalty > windows*steerLimit(rate) {
		t.Fatalf("%d datagrams read on the penalty socket in %d windows (limit %d each)", penalty, windows, steerLimit(rate))
	}
	if dropped == 0 || dropped+penalty > sent {
		t.Fatalf("%d dropped in the kernel and %d read, of %d sent", dropped, penalty, sent)
	}
	if got := e.r.limits.session(1).excess.Load(); got <= entered {
		t.Fatal("the kernel's drops did not keep the session in the box")
	}
	var b strings.Builder
	if err := e.r.WriteMetrics(&b); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`shinken_dns_kernel_dropped_total{session="s1"} %d`, dropped); !strings.Contains(b.String(), want) {
		t.Fatalf("metrics lack %q", want)
	}
	// Another session is answered from its own socket.
	before = e.r.udp.received()
	if resp := e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA); resp.Rcode != dns.RcodeSuccess {
		t.Fatal(resp)
	}
	after = e.r.udp.received()
	if s := (sessionBase + 300) % 2; after[s] != before[s]+1 {
		t.Fatalf("session 300: %v -> %v", before, after)
	}

	// Out of the box: drops counted up to the removal, and the session's
	// datagrams back on its own socket.
	for range 2000 {
		c.Write(q)
	}
	e.r.limits.session(1).excess.Store(time.Now().Add(-2 * penaltyHold).UnixNano())
	e.r.box.expire(e.r.limits, time.Now().UnixNano())
	if e.r.penalised(1) {
		t.Fatal("still in the box")
	}
	e.r.countKernelDrops(time.Now().UnixNano())
	if got := e.r.Stats().Sessions["s1"].KernelDropped; got <= dropped {
		t.Fatalf("KernelDropped %d after a second burst, was %d", got, dropped)
	}
	before = e.r.udp.received()
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	after = e.r.udp.received()
	if s := (sessionBase + 1) % 2; after[s] != before[s]+1 {
		t.Fatalf("session 1 out of the box: %v -> %v", before, after)
	}
}

// TestFloodKeepsOthersCached: one session asks for many more distinct
// names than the resolver caches; another session's cached answer and
// prepared reply stay (a full table drops what the sessions holding the
// most put there, share.go): its next query goes neither upstream nor
// down the full path.
func TestFloodKeepsOthersCached(t *testing.T) {
	const size = 64
	e := newTestEnv(t, func(c *Config) { c.CacheSize, c.QueryRate, c.QueryBurst = size, 100000, 100000 })
	if err := e.r.SetPolicy("s2", testPolicy); err != nil {
		t.Fatal(err)
	}
	e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA) // fetched, written
	e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA) // answered from the cache: its reply prepared
	fast := fastKey(nil, 300, dns.TypeA, wireName(nil, "api.allowed.test"))
	if e.r.fast.get(fast) == nil {
		t.Fatal("no prepared reply for s2's cached answer")
	}
	asked := e.up.queries()
	for i := range 5 * size {
		if m := e.ask(t, 1, "udp", fmt.Sprintf("f%d.allowed.test.", i), dns.TypeA); m.Rcode != dns.RcodeNameError {
			t.Fatalf("flood name %d: rcode %s", i, dns.RcodeToString[m.Rcode])
		}
	}
	if got := e.up.queries() - asked; got != 5*size {
		t.Fatalf("the flood's %d distinct names took %d upstream queries", 5*size, got)
	}
	e.r.cache.mu.RLock()
	held := len(e.r.cache.m)
	e.r.cache.mu.RUnlock()
	if held > size {
		t.Fatalf("the answer cache holds %d, over its bound of %d", held, size)
	}
	if e.r.fast.get(fast) == nil {
		t.Fatal("s2's prepared reply was dropped while s1 filled the table")
	}
	asked = e.up.queries()
	if m := e.ask(t, 300, "udp", "api.allowed.test.", dns.TypeA); len(m.Answer) != 1 {
		t.Fatalf("s2's answer after the flood: %v", m)
	}
	if e.up.queries() != asked {
		t.Fatal("s2's cached answer was evicted by s1's flood: asked upstream again")
	}
}
