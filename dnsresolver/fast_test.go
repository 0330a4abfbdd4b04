package dnsresolver

import (
	"bytes"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
)

// fastEnv is a resolver without sockets, a fake clock and an in-memory
// upstream serving the test zone, for driving the fast and full paths side
// by side.
type fastEnv struct {
	r   *Resolver
	dp  *fakeDataplane
	now time.Time
	s   fastScratch
}

func newFastEnv(t testing.TB, zone *fakeUpstream, mods ...func(*Config)) *fastEnv {
	t.Helper()
	e := &fastEnv{dp: newFakeDataplane(), now: time.Unix(1_800_000_000, 0)}
	e.dp.sessions[1] = "s1"
	e.dp.sessions[2] = "s2"
	cfg := Config{
		Dataplane:   e.dp,
		SessionName: e.dp.SessionByIndex,
		Upstreams:   []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		HostAddrs:   NewHostAddrs(fuzzHostAddrs...),
		now:         func() time.Time { return e.now },
	}
	for _, m := range mods {
		m(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetPolicy("s1", fuzzPolicy); err != nil {
		t.Fatal(err)
	}
	r.up = memExchanger{zone}
	e.r = r
	return e
}

// fast is the fast path's reply (nil, false when it does not answer).
func (e *fastEnv) fast(idx uint32, q []byte) ([]byte, bool) {
	local := SessionAddr(idx)
	if !local.IsValid() {
		local = netip.MustParseAddr("127.0.0.1")
	}
	return e.r.answerFast(&e.s, local.As4(), q, e.now, nil)
}

func (e *fastEnv) full(idx uint32, q []byte) []byte {
	local := SessionAddr(idx)
	if !local.IsValid() {
		local = netip.MustParseAddr("127.0.0.1")
	}
	return e.r.handleRaw(local, "udp", q)
}

func wireQuery(name string, qtype uint16, edns bool) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0x1234
	if edns {
		m.SetEdns0(4096, false)
	}
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzFastPath: for any query, once the full path has answered it, the fast
// path either declines or gives byte for byte the reply the full path gives
// (at a later time too: TTLs), with the same counters and no entry write.
func FuzzFastPath(f *testing.F) {
	for _, s := range []struct {
		q    []byte
		secs uint16
	}{
		{wireQuery("api.allowed.test.", dns.TypeA, false), 0},
		{wireQuery("API.Allowed.TEST.", dns.TypeA, true), 7},
		{wireQuery("allowed.test.", dns.TypeAAAA, false), 100},
		{wireQuery("allowed.test.", dns.TypeTXT, false), 1},
		{wireQuery("www.chain.test.", dns.TypeA, true), 15},
		{wireQuery("rebind.test.", dns.TypeA, false), 2},
		{wireQuery("nx.allowed.test.", dns.TypeA, false), 3},
		{wireQuery("notallowed.test.", dns.TypeA, false), 0},
		{wireQuery("blocked.evil.test.", dns.TypeA, false), 0},
		{wireQuery("x.fuzz.test.", dns.TypeA, false), 0},
		{wireQuery("deep.api.allowed.test.", dns.TypeA, false), 0},
		{wireQuery("many.test.", dns.TypeA, false), 0},
		{wireQuery("1.fuzz.test.", dns.TypeA, false), 0},
		{wireQuery("a-.fuzz.test.", dns.TypeA, false), 0},
		{wireQuery("allowed.test.", dns.TypeHTTPS, false), 0},
		{wireQuery(strings.Repeat("a", 63)+"."+strings.Repeat("b", 63)+"."+strings.Repeat("c", 63)+"."+strings.Repeat("d", 49)+".fuzz.test.", dns.TypeA, false), 0},
	} {
		for _, idx := range []uint8{1, 2} {
			f.Add(s.q, s.secs, idx)
		}
	}
	zone := loadZone(f, testZone)
	f.Fuzz(func(t *testing.T, q []byte, secs uint16, idx uint8) {
		e := newFastEnv(t, zone)
		i := uint32(idx % 4)
		e.full(i, q) // prepares a reply when it can
		e.dp.take()
		e.now = e.now.Add(time.Duration(secs) * time.Second / 4)
		st0 := e.r.Stats()
		got, ok := e.fast(i, q)
		st1 := e.r.Stats()
		if !ok {
			if !reflect.DeepEqual(st0, st1) {
				t.Fatalf("declined, but counted: %+v -> %+v", st0.Total, st1.Total)
			}
			return
		}
		if w := e.dp.take(); len(w) != 0 {
			t.Fatalf("fast path wrote %v", w)
		}
		want := e.full(i, q)
		st2 := e.r.Stats()
		if w := e.dp.take(); len(w) != 0 {
			t.Fatalf("the full path had to write %v: the fast path answered without the entry", w)
		}
		if !bytes.Equal(got, want) {
			g, w := new(dns.Msg), new(dns.Msg)
			g.Unpack(got)
			w.Unpack(want)
			t.Fatalf("fast path reply\n%x\n%v\nfull path reply\n%x\n%v", got, g, want, w)
		}
		if d1, d2 := diffStats(st0, st1), diffStats(st1, st2); !reflect.DeepEqual(d1, d2) {
			t.Fatalf("counters: fast path %+v, full path %+v", d1, d2)
		}
	})
}

func diffStats(a, b Stats) map[string]Counters {
	sub := func(x, y Counters) Counters {
		d := Counters{Queries: y.Queries - x.Queries, Answered: y.Answered - x.Answered, Refused: y.Refused - x.Refused,
			ServFail: y.ServFail - x.ServFail, CacheHits: y.CacheHits - x.CacheHits, EntriesWritten: y.EntriesWritten - x.EntriesWritten,
			WriteErrors: y.WriteErrors - x.WriteErrors, WritesSkipped: y.WritesSkipped - x.WritesSkipped, Stripped: y.Stripped - x.Stripped,
			Dropped: y.Dropped - x.Dropped, RateDropped: y.RateDropped - x.RateDropped, WriteLimited: y.WriteLimited - x.WriteLimited,
			HostStripped: y.HostStripped - x.HostStripped}
		for i := range d.Denials {
			d.Denials[i] = y.Denials[i] - x.Denials[i]
		}
		return d
	}
	out := map[string]Counters{"": sub(a.Total, b.Total)}
	for k, v := range b.Sessions {
		out[k] = sub(a.Sessions[k], v)
	}
	return out
}

// TestFastPath: the fast path answers repeated plain queries, with the
// client's ID, case and EDNS, the TTL left; and stops answering (the full
// path decides afresh, and writes again where needed) as soon as the
// session, its policy, the cached result or the write memo changes.
func TestFastPath(t *testing.T) {
	e := newFastEnv(t, loadZone(t, testZone))
	q := wireQuery("api.allowed.test.", dns.TypeA, false)
	mustFast := func(t *testing.T, idx uint32, q []byte) *dns.Msg {
		t.Helper()
		b, ok := e.fast(idx, q)
		if !ok {
			t.Fatal("fast path declined")
		}
		if !bytes.Equal(b, e.full(idx, q)) {
			t.Fatal("fast and full paths differ")
		}
		m := new(dns.Msg)
		if err := m.Unpack(b); err != nil {
			t.Fatal(err)
		}
		return m
	}
	noFast := func(t *testing.T, idx uint32, q []byte) {
		t.Helper()
		if _, ok := e.fast(idx, q); ok {
			t.Fatal("fast path answered")
		}
	}
	writes := func(t *testing.T, n int) {
		t.Helper()
		if got := e.dp.take(); len(got) != n {
			t.Fatalf("%d writes, want %d: %v", len(got), n, got)
		}
	}
	t.Run("first query takes the full path", func(t *testing.T) {
		noFast(t, 1, q)
		e.full(1, q)
		writes(t, 1)
	})
	t.Run("then the fast path, TTL counting down", func(t *testing.T) {
		m := mustFast(t, 1, q)
		if m.Id != 0x1234 || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].Header().Ttl != 120 {
			t.Fatalf("%v", m)
		}
		e.now = e.now.Add(30500 * time.Millisecond)
		if m := mustFast(t, 1, q); m.Answer[0].Header().Ttl != 89 {
			t.Fatalf("TTL %d after 30.5s", m.Answer[0].Header().Ttl)
		}
		writes(t, 0)
	})
	t.Run("client case, ID, RD, CD and EDNS", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("aPi.ALLOWED.test.", dns.TypeA)
		m.Id, m.RecursionDesired, m.CheckingDisabled = 0xbeef, false, true
		m.SetEdns0(1400, true)
		b, _ := m.Pack()
		r := mustFast(t, 1, b)
		if r.Id != 0xbeef || r.RecursionDesired || !r.CheckingDisabled || r.Question[0].Name != "aPi.ALLOWED.test." ||
			r.Answer[0].Header().Name != "aPi.ALLOWED.test." || r.IsEdns0() == nil || r.IsEdns0().UDPSize() != 1232 || r.IsEdns0().Do() {
			t.Fatalf("%v", r)
		}
		writes(t, 0)
	})
	t.Run("another session index has its own", func(t *testing.T) {
		noFast(t, 2, q) // s2 has no policy
		if m := new(dns.Msg); m.Unpack(e.full(2, q)) != nil || m.Rcode != dns.RcodeRefused {
			t.Fatal("s2 not refused")
		}
		noFast(t, 3, q) // no session
		noFast(t, 0, q) // not a session address
	})
	t.Run("hostile names never reach the lookup", func(t *testing.T) {
		for _, n := range []string{`api\000.allowed.test.`, "api_x.allowed.test.", "-api.allowed.test.", "api.allowed.123.", "api..allowed.test."} {
			m := new(dns.Msg)
			m.SetQuestion(n, dns.TypeA)
			b, err := m.Pack()
			if err != nil {
				continue
			}
			noFast(t, 1, b)
		}
	})
	t.Run("a new session at the index", func(t *testing.T) {
		e.dp.setSession(1, "s3")
		noFast(t, 1, q)
		if m := new(dns.Msg); m.Unpack(e.full(1, q)) != nil || m.Rcode != dns.RcodeRefused {
			t.Fatal("s3 not refused")
		}
		e.dp.setSession(1, "s1")
		mustFast(t, 1, q)
	})
	t.Run("another session's new policy leaves it", func(t *testing.T) {
		// s2's grants change (the agent pushes its policy at each of
		// them): s1's prepared reply and written entries stay good, so a
		// neighbour's grant churn costs s1 nothing.
		for range 3 {
			if err := e.r.SetPolicy("s2", fuzzPolicy); err != nil {
				t.Fatal(err)
			}
			mustFast(t, 1, q)
		}
		e.r.RemovePolicy("s2")
		writes(t, 0)
	})
	t.Run("a new policy denying the name", func(t *testing.T) {
		p := fuzzPolicy
		p.Deny = append([]string{"api.allowed.test"}, p.Deny...)
		if err := e.r.SetPolicy("s1", p); err != nil {
			t.Fatal(err)
		}
		noFast(t, 1, q)
		if m := new(dns.Msg); m.Unpack(e.full(1, q)) != nil || m.Rcode != dns.RcodeRefused {
			t.Fatal("denied name not refused")
		}
		noFast(t, 1, q)
	})
	t.Run("the same policy again", func(t *testing.T) {
		// A new policy voids the prepared reply (the full path decides
		// again); the entry it wrote is still in the kernel, so no write.
		if err := e.r.SetPolicy("s1", fuzzPolicy); err != nil {
			t.Fatal(err)
		}
		noFast(t, 1, q)
		e.full(1, q)
		writes(t, 0)
		mustFast(t, 1, q)
	})
	t.Run("a new grant for the name", func(t *testing.T) {
		// Its rule is written; the other grant's, written before, is not
		// written again.
		p := fuzzPolicy
		p.Grants = append([]Grant{{Pattern: "api.allowed.test", Handle: h3, Proto: dataplane.ProtoUDP, Ports: dataplane.Port(53)}}, p.Grants...)
		if err := e.r.SetPolicy("s1", p); err != nil {
			t.Fatal(err)
		}
		noFast(t, 1, q)
		e.full(1, q)
		writes(t, 1)
		mustFast(t, 1, q)
	})
	t.Run("policy removed", func(t *testing.T) {
		e.r.RemovePolicy("s1")
		noFast(t, 1, q)
		if err := e.r.SetPolicy("s1", fuzzPolicy); err != nil {
			t.Fatal(err)
		}
		e.full(1, q)
		writes(t, 1)
	})
	t.Run("another session's writes forgotten", func(t *testing.T) {
		mustFast(t, 1, q)
		e.r.memo.add("s2", dataplane.EgressRule{Prefix: netip.MustParsePrefix("192.0.2.1/32"), Expires: e.now.Add(time.Hour)})
		e.r.memo.forget("s2")
		mustFast(t, 1, q)
		writes(t, 0)
	})
	t.Run("its writes forgotten", func(t *testing.T) {
		mustFast(t, 1, q)
		e.r.memo.forget("s1")
		noFast(t, 1, q)
		e.full(1, q)
		writes(t, 1)
		mustFast(t, 1, q)
	})
	t.Run("another session filling the write memo", func(t *testing.T) {
		// The memo is full: the session holding the most is forgotten,
		// s2 here, and s1's prepared reply stays good.
		mustFast(t, 1, q)
		e.r.memo.mu.Lock()
		mine := len(e.r.memo.s["s1"].m)
		e.r.memo.max = e.r.memo.n + mine + 1 // full once s2 holds more than s1
		e.r.memo.mu.Unlock()
		for i := range mine + 20 {
			e.r.memo.add("s2", dataplane.EgressRule{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 32), Expires: e.now.Add(time.Hour)})
		}
		mustFast(t, 1, q)
		writes(t, 0)
		e.r.memo.mu.Lock()
		n, held := e.r.memo.n, len(e.r.memo.s["s1"].m)+len(e.r.memo.s["s2"].m)
		e.r.memo.max = memoSize
		e.r.memo.mu.Unlock()
		if n != held {
			t.Fatalf("the memo counts %d entries and holds %d", n, held)
		}
		e.r.memo.forget("s2")
	})
	t.Run("cached result expired", func(t *testing.T) {
		e.now = e.now.Add(2 * time.Minute)
		noFast(t, 1, q)
		e.full(1, q) // upstream again, a new result, a new entry
		writes(t, 1)
		mustFast(t, 1, q)
	})
	t.Run("CNAME chain, NXDOMAIN, AAAA, bounded answer", func(t *testing.T) {
		for _, q := range [][]byte{
			wireQuery("www.chain.test.", dns.TypeA, false),
			wireQuery("nx.allowed.test.", dns.TypeA, true),
			wireQuery("allowed.test.", dns.TypeAAAA, false),
			wireQuery("many.test.", dns.TypeA, false), // 16 of its 100 records
		} {
			e.full(1, q)
			mustFast(t, 1, q)
		}
	})
	t.Run("not taken: stripped addresses, passthrough, too big", func(t *testing.T) {
		for _, q := range [][]byte{
			wireQuery("rebind.test.", dns.TypeA, false),
			wireQuery("allowed.test.", dns.TypeTXT, false),
			wireQuery("allowed.test.", dns.TypeHTTPS, false),
		} {
			e.full(1, q)
			noFast(t, 1, q)
		}
		big := newFastEnv(t, loadZone(t, testZone), func(c *Config) { c.MaxAnswerRecords = 100 })
		q := wireQuery("many.test.", dns.TypeA, false)
		big.full(1, q)
		if _, ok := big.fast(1, q); ok {
			t.Fatal("fast path answered a reply over 512 bytes")
		}
	})
}

// TestFastPathAlwaysWrite: with AlwaysWrite (no memo) every answer writes,
// so nothing is prepared.
func TestFastPathAlwaysWrite(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.AlwaysWrite = true })
	if e.r.fast != nil {
		t.Fatal("fast path with AlwaysWrite")
	}
	for range 3 {
		e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
	}
	if got := e.dp.take(); len(got) != 3 {
		t.Fatalf("%d writes for 3 answers", len(got))
	}
}

// TestUDPBusyPoll: answers come back the same with the worker polling
// (the default) or always sleeping, under concurrent clients.
func TestUDPBusyPoll(t *testing.T) {
	for _, poll := range []time.Duration{0, -1} {
		e := newTestEnv(t, func(c *Config) { c.UDPBusyPoll = poll })
		e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				q := new(dns.Msg)
				q.SetQuestion("api.allowed.test.", dns.TypeA)
				to := netip.AddrPortFrom(SessionAddr(1), e.r.Port()).String()
				for range 50 {
					m, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(q, to)
					if err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
						t.Errorf("poll %v: %v %v", poll, m, err)
						return
					}
				}
			})
		}
		wg.Wait()
		if got := e.dp.take(); len(got) != 1 {
			t.Fatalf("poll %v: %d writes, want 1", poll, len(got))
		}
	}
}
