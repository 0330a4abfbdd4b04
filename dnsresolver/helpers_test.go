package dnsresolver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
)

// zone is a fixed set of records served by fakeUpstream, in zone-file syntax.
var testZone = []string{
	"allowed.test. 300 IN A 93.184.216.34",
	"allowed.test. 300 IN AAAA 2606:2800:220:1::1",
	"allowed.test. 300 IN TXT \"hello\"",
	"api.allowed.test. 120 IN A 93.184.216.35",
	"deep.api.allowed.test. 120 IN A 93.184.216.36",
	// CNAME chain of three names.
	"www.chain.test. 60 IN CNAME edge.cdn.test.",
	"edge.cdn.test. 30 IN CNAME e1.provider.test.",
	"e1.provider.test. 20 IN A 198.41.0.4",
	"e1.provider.test. 20 IN AAAA 2001:503:ba3e::2:30",
	// Rebinding: mostly non-public answers.
	"rebind.test. 300 IN A 10.0.0.1",
	"rebind.test. 300 IN A 127.0.0.1",
	"rebind.test. 300 IN A 169.254.169.254",
	"rebind.test. 300 IN A 100.64.1.1",
	"rebind.test. 300 IN A 192.168.1.1",
	"rebind.test. 300 IN A 8.8.8.8",
	"rebind.test. 300 IN AAAA ::1",
	"rebind.test. 300 IN AAAA fd00::1",
	"rebind.test. 300 IN AAAA ::ffff:10.0.0.1",
	"rebind.test. 300 IN AAAA 2001:db8::1",
	"rebind.test. 300 IN AAAA fe80::1",
	"rebind.test. 300 IN AAAA 2a00:1450:4001::1",
	"internal.corp.test. 300 IN A 10.1.2.3",
	"internal.corp.test. 300 IN A 192.168.9.9",
	"internal.corp.test. 300 IN A 127.128.0.2", // another session's resolver address
	"short.test. 0 IN A 1.1.1.1",
	"long.test. 86400 IN A 1.0.0.1",
	// CNAME to a denied name, to an invalid name, in a loop, too long.
	"alias.test. 300 IN CNAME blocked.evil.test.",
	"blocked.evil.test. 300 IN A 6.6.6.6",
	"badtarget.test. 300 IN CNAME bad_name.test.",
	"loop.test. 300 IN CNAME loop2.test.",
	"loop2.test. 300 IN CNAME loop.test.",
	"nodata.test. 300 IN TXT \"only txt\"",
}

func init() {
	// c0.chain.test -> c1 -> ... -> c12 -> A
	for i := range 12 {
		testZone = append(testZone, fmt.Sprintf("c%d.longchain.test. 300 IN CNAME c%d.longchain.test.", i, i+1))
	}
	testZone = append(testZone, "c12.longchain.test. 300 IN A 1.2.3.4")
	// many.test has 100 A records: too big for 512-byte UDP.
	for i := range 100 {
		testZone = append(testZone, fmt.Sprintf("many.test. 300 IN A 4.4.%d.%d", i/250, 1+i%250))
	}
}

// fakeUpstream is a recursive-looking nameserver on 127.0.0.1 serving a
// fixed zone (following CNAMEs like a recursor would) and logging every
// question it is asked.
type fakeUpstream struct {
	addr  netip.AddrPort
	rrs   map[string][]dns.RR // by lower-case owner
	mu    sync.Mutex
	asked []string // "name/TYPE"
	msgs  []*dns.Msg
	udp   *dns.Server
	tcp   *dns.Server
	rcode int // if non-zero, answer every query with it
	delay time.Duration
	srcs  []string // source address of each query
}

func startFakeUpstream(t testing.TB, zone []string) *fakeUpstream {
	t.Helper()
	f := loadZone(t, zone)
	var (
		pc   net.PacketConn
		ln   net.Listener
		port int
	)
	for try := 0; ; try++ {
		var err error
		pc, err = net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = pc.LocalAddr().(*net.UDPAddr).Port
		ln, err = net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			t.Fatal(err)
		}
	}
	f.addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	f.udp = &dns.Server{PacketConn: pc, Handler: f}
	f.tcp = &dns.Server{Listener: ln, Handler: f}
	started := make(chan struct{}, 2)
	f.udp.NotifyStartedFunc = func() { started <- struct{}{} }
	f.tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go f.udp.ActivateAndServe()
	go f.tcp.ActivateAndServe()
	<-started
	<-started
	t.Cleanup(f.stop)
	return f
}

// loadZone builds a fakeUpstream that does not listen (see memExchanger).
func loadZone(t testing.TB, zone []string) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{rrs: map[string][]dns.RR{}}
	for _, s := range zone {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatalf("zone %q: %v", s, err)
		}
		n := strings.ToLower(rr.Header().Name)
		f.rrs[n] = append(f.rrs[n], rr)
	}
	return f
}

func (f *fakeUpstream) stop() {
	f.udp.Shutdown()
	f.tcp.Shutdown()
}

func (f *fakeUpstream) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	f.mu.Lock()
	f.asked = append(f.asked, strings.ToLower(q.Name)+"/"+dns.TypeToString[q.Qtype])
	f.srcs = append(f.srcs, w.RemoteAddr().String())
	f.msgs = append(f.msgs, req.Copy())
	rcode, delay := f.rcode, f.delay
	f.mu.Unlock()
	time.Sleep(delay)
	m := new(dns.Msg)
	m.SetReply(req)
	if rcode != 0 {
		m.Rcode = rcode
		w.WriteMsg(m)
		return
	}
	m.Answer = f.resolve(strings.ToLower(q.Name), q.Qtype)
	if len(m.Answer) == 0 && len(f.rrs[strings.ToLower(q.Name)]) == 0 {
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{mustRR("test. 30 IN SOA ns.test. host.test. 1 3600 600 86400 30")}
	}
	if _, ok := w.RemoteAddr().(*net.UDPAddr); ok {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

func (f *fakeUpstream) resolve(name string, qtype uint16) []dns.RR {
	var out []dns.RR
	for range 20 {
		var next string
		for _, rr := range f.rrs[name] {
			switch {
			case rr.Header().Rrtype == qtype:
				out = append(out, rr)
			case rr.Header().Rrtype == dns.TypeCNAME:
				out = append(out, rr)
				next = strings.ToLower(rr.(*dns.CNAME).Target)
			}
		}
		if next == "" {
			break
		}
		name = next
	}
	return out
}

// askedFor reports whether any question about name (any type) reached the upstream.
func (f *fakeUpstream) askedFor(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.asked {
		if strings.HasPrefix(a, strings.ToLower(dns.Fqdn(name))+"/") {
			return true
		}
	}
	return false
}

func (f *fakeUpstream) queries() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

func mustRR(s string) dns.RR {
	rr, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

// entry is one AllowEgress call.
type entry struct {
	Session string
	Rule    dataplane.EgressRule
}

// fakeDataplane records entries in memory and names sessions by index.
type fakeDataplane struct {
	mu       sync.Mutex
	sessions map[uint32]string
	entries  []entry
	fail     error
}

func newFakeDataplane() *fakeDataplane { return &fakeDataplane{sessions: map[uint32]string{}} }

func (d *fakeDataplane) AllowEgress(session string, r dataplane.EgressRule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return d.fail
	}
	d.entries = append(d.entries, entry{session, r})
	return nil
}

func (d *fakeDataplane) SessionByIndex(i uint32) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[i]
	return s, ok
}

func (d *fakeDataplane) take() []entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.entries
	d.entries = nil
	return e
}

var (
	h1 = dataplane.HandleRef{Slot: 1, Generation: 1}
	h2 = dataplane.HandleRef{Slot: 2, Generation: 7}
	h3 = dataplane.HandleRef{Slot: 3, Generation: 1}
)

// testPolicy is session "s1"'s policy (index 1).
var testPolicy = Policy{
	Grants: []Grant{
		{Pattern: "allowed.test", Handle: h1, Proto: dataplane.ProtoTCP, Ports: dataplane.Port(443)},
		{Pattern: "*.allowed.test", Handle: h2, Proto: dataplane.ProtoAny},
		{Pattern: "www.chain.test", Handle: h1, Proto: dataplane.ProtoTCP, Ports: dataplane.Port(443)},
		{Pattern: "rebind.test", Handle: h1},
		{Pattern: "internal.corp.test", Handle: h3, AllowNonPublic: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8")}},
		{Pattern: "**.short.test", Handle: h1},
		{Pattern: "long.test", Handle: h1},
		{Pattern: "alias.test", Handle: h1},
		{Pattern: "badtarget.test", Handle: h1},
		{Pattern: "loop.test", Handle: h1},
		{Pattern: "c0.longchain.test", Handle: h1},
		{Pattern: "nx.allowed.test", Handle: h1},
		{Pattern: "nodata.test", Handle: h1},
		{Pattern: "many.test", Handle: h1},
		{Pattern: "**.evil.test", Handle: h1},
	},
	Deny: []string{"**.evil.test"},
}

type testEnv struct {
	r   *Resolver
	up  *fakeUpstream
	dp  *fakeDataplane
	den *denialLog
}

type denialLog struct {
	mu sync.Mutex
	d  []Denial
}

func (l *denialLog) add(d Denial) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }
func (l *denialLog) take() []Denial {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.d
	l.d = nil
	return d
}

// newTestEnv starts a fake upstream and a resolver on 0.0.0.0:<free port>
// with session "s1" at index 1 holding testPolicy and session "s2" at
// index 300 with no policy.
func newTestEnv(t testing.TB, mod func(*Config)) *testEnv {
	t.Helper()
	e := &testEnv{up: startFakeUpstream(t, testZone), dp: newFakeDataplane(), den: &denialLog{}}
	e.dp.sessions[1] = "s1"
	e.dp.sessions[300] = "s2"
	cfg := Config{
		Dataplane:   e.dp,
		SessionName: e.dp.SessionByIndex,
		ListenAddr:  netip.MustParseAddrPort("0.0.0.0:0"),
		Upstreams:   []netip.AddrPort{e.up.addr},
		MinTTL:      5 * time.Second,
		MaxTTL:      time.Hour,
		OnDenial:    e.den.add,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetPolicy("s1", testPolicy); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	e.r = r
	return e
}

// ask sends one query for name/qtype to session index idx over transport
// ("udp" or "tcp") with a real socket, as a redirected session would.
func (e *testEnv) ask(t testing.TB, idx uint32, transport, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return e.exchange(t, netip.AddrPortFrom(SessionAddr(idx), e.r.Port()), transport, m)
}

func (e *testEnv) exchange(t testing.TB, to netip.AddrPort, transport string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: transport, Timeout: 3 * time.Second}
	resp, _, err := c.Exchange(m, to.String())
	if err != nil {
		t.Fatalf("exchange %s %s %s: %v", transport, to, m.Question[0].Name, err)
	}
	return resp
}

func answerAddrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		case *dns.CNAME:
			out = append(out, "cname:"+strings.TrimSuffix(v.Target, "."))
		}
	}
	return out
}

var errInjected = errors.New("injected failure")

// memExchanger is an in-process upstream for unit tests and fuzzing.
type memExchanger struct {
	f *fakeUpstream
}

func (m memExchanger) exchange(_ context.Context, q *dns.Msg) (*dns.Msg, error) {
	w := &memWriter{}
	m.f.ServeDNS(w, q)
	if w.m == nil {
		return nil, errInjected
	}
	return w.m, checkReply(q, w.m)
}

type memWriter struct{ m *dns.Msg }

func (w *memWriter) LocalAddr() net.Addr       { return &net.TCPAddr{} }
func (w *memWriter) RemoteAddr() net.Addr      { return &net.TCPAddr{} }
func (w *memWriter) WriteMsg(m *dns.Msg) error { w.m = m; return nil }
func (w *memWriter) Write([]byte) (int, error) { return 0, errInjected }
func (w *memWriter) Close() error              { return nil }
func (w *memWriter) TsigStatus() error         { return nil }
func (w *memWriter) TsigTimersOnly(bool)       {}
func (w *memWriter) Hijack()                   {}
func (w *memWriter) Network() string           { return "tcp" }

func portRange(lo, hi uint16) dataplane.PortRange { return dataplane.PortRange{Lo: lo, Hi: hi} }

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }

func (d *fakeDataplane) setSession(i uint32, name string) {
	d.mu.Lock()
	d.sessions[i] = name
	d.mu.Unlock()
}
func (d *fakeDataplane) setFail(err error) { d.mu.Lock(); d.fail = err; d.mu.Unlock() }
func (f *fakeUpstream) setRcode(rc int)    { f.mu.Lock(); f.rcode = rc; f.mu.Unlock() }

func (f *fakeUpstream) setDelay(d time.Duration) { f.mu.Lock(); f.delay = d; f.mu.Unlock() }

// Port4 is the address:port of session idx's resolver, for a dns.Client.
func (r *Resolver) Port4(idx uint32) string {
	return netip.AddrPortFrom(SessionAddr(idx), r.Port()).String()
}
