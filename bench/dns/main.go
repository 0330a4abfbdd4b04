//go:build linux

// Command dns benchmarks Shinken's allowlisting resolver (dnsresolver) against
// dnsmasq, side by side in one run, both forwarding to the same fake upstream
// on loopback. See README.md.
//
// Scenarios, each a closed loop of -c concurrent clients with one UDP socket
// each, run in -rounds interleaved rounds of -d:
//
//	shinken/allowed  allowed names: answer + one egress entry write per query
//	                 (into a real dataplane when one can be opened, else into
//	                 an in-memory sink, said in the output)
//	shinken/refused  names outside the allowlist: REFUSED, never forwarded
//	dnsmasq/allowed  the same allowed names (dnsmasq: server=/allowed.bench/..., cached)
//	dnsmasq/refused  the same refused names (dnsmasq has no server for them: REFUSED)
//
// Everything listens and sends on 127.0.0.0/8 only.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dnsresolver"
)

var (
	flagConc     = flag.Int("c", 8, "concurrent clients per scenario")
	flagDur      = flag.Duration("d", 2*time.Second, "duration of one scenario in one round")
	flagRounds   = flag.Int("rounds", 3, "interleaved rounds")
	flagNames    = flag.Int("names", 1000, "distinct allowed (and refused) names")
	flagDP       = flag.String("dataplane", "auto", "real dataplane for entry writes: auto, on, off")
	flagDnsmasq  = flag.String("dnsmasq", "dnsmasq", "dnsmasq binary")
	flagWorkers  = flag.Int("workers", 0, "resolver UDP workers (0: default)")
	flagUpstream = flag.Duration("upstream-delay", 0, "added latency of the fake upstream")
	flagProfile  = flag.String("cpuprofile", "", "write a CPU profile of the resolver process during the first shinken/allowed scenario here")
)

const clientEnv = "SHINKEN_BENCH_DNS_CLIENT"

func main() {
	log.SetFlags(0)
	flag.Parse()
	if os.Getenv(clientEnv) != "" {
		clientMain()
		return
	}
	if os.Getenv(upstreamEnv) != "" {
		upstreamMain()
		return
	}
	if err := run(); err != nil {
		log.Fatalf("bench-dns: %v", err)
	}
}

// ---- fake upstream ----

const upstreamEnv = "SHINKEN_BENCH_DNS_UPSTREAM"

// upstreamMain runs the fake upstream in its own process (so its CPU is
// nobody's under test): it prints "PORT\n", serves until stdin closes, then
// prints the number of queries it answered.
func upstreamMain() {
	u, err := startUpstream(*flagUpstream)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(u.addr.Port())
	io.Copy(io.Discard, os.Stdin)
	u.close()
	fmt.Println(u.n.Load())
}

// upstreamProc is the fake upstream's process, seen from the bench.
type upstreamProc struct {
	addr netip.AddrPort
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
}

func startUpstreamProc() (*upstreamProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-upstream-delay", flagUpstream.String())
	cmd.Env = append(os.Environ(), upstreamEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &upstreamProc{cmd: cmd, in: in, out: bufio.NewReader(outp)}
	var port uint16
	if _, err := fmt.Fscanln(p.out, &port); err != nil {
		p.stop()
		return nil, fmt.Errorf("fake upstream: %w", err)
	}
	p.addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	return p, nil
}

// stop ends the process (by closing its stdin) and returns its query count.
func (p *upstreamProc) stop() uint64 {
	p.in.Close()
	var n uint64
	fmt.Fscanln(p.out, &n)
	p.cmd.Wait()
	return n
}

type upstream struct {
	addr  netip.AddrPort
	delay time.Duration
	n     atomic.Uint64
	srv   []*dns.Server
}

func startUpstream(delay time.Duration) (*upstream, error) {
	var (
		pc   net.PacketConn
		ln   net.Listener
		port int
	)
	for try := 0; ; try++ {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		port = pc.LocalAddr().(*net.UDPAddr).Port
		if ln, err = net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			return nil, err
		}
	}
	u := &upstream{addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)), delay: delay}
	u.srv = []*dns.Server{{PacketConn: pc, Handler: u}, {Listener: ln, Handler: u}}
	var wg sync.WaitGroup
	for _, s := range u.srv {
		wg.Add(1)
		s.NotifyStartedFunc = wg.Done
		go s.ActivateAndServe()
	}
	wg.Wait()
	return u, nil
}

// ServeDNS answers every nK.allowed.bench with one public A record (never
// contacted: it only becomes a map entry), TTL 300; anything else NXDOMAIN.
func (u *upstream) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	u.n.Add(1)
	if u.delay > 0 {
		time.Sleep(u.delay)
	}
	m := new(dns.Msg)
	m.SetReply(req)
	q := req.Question[0]
	var k int
	if _, err := fmt.Sscanf(strings.ToLower(q.Name), "n%d.allowed.bench.", &k); err == nil && q.Qtype == dns.TypeA {
		m.Answer = []dns.RR{&dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
			A:   net.IPv4(93, 184, byte(k>>8), byte(k)),
		}}
	} else {
		m.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(m)
}

func (u *upstream) close() {
	for _, s := range u.srv {
		s.Shutdown()
	}
}

// ---- entry sinks ----

type memSink struct {
	mu sync.Mutex
	m  map[netip.Prefix]dataplane.EgressRule
}

func (s *memSink) AllowEgress(_ string, r dataplane.EgressRule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.m[r.Prefix] = r
	s.mu.Unlock()
	return nil
}

type sink struct {
	dnsresolver.Dataplane
	desc    string
	session string
	index   uint32
	handle  dataplane.HandleRef
	count   func() int
	close   func()
	n       atomic.Uint64
	dp      *dataplane.Dataplane // nil for the in-memory sink
	sess    dataplane.Session
}

// AllowEgress counts and forwards.
func (s *sink) AllowEgress(session string, r dataplane.EgressRule) error {
	s.n.Add(1)
	return s.Dataplane.AllowEgress(session, r)
}

func (s *sink) writes() uint64 { return s.n.Load() }

// openSink opens a private dataplane (own parent cgroup and pin path,
// uninstalled at exit) with one session, or falls back to memory.
func openSink(mode string) (*sink, error) {
	if mode != "off" {
		b := make([]byte, 4)
		rand.Read(b)
		n := "shinken-benchdns-" + hex.EncodeToString(b)
		dp, err := dataplane.Open(dataplane.Config{Parent: n, PinPath: "/sys/fs/bpf/" + n, MaxSessions: 16, MaxHandles: 64, MaxEgress4: 1 << 16, MaxEgress6: 1 << 10})
		if err == nil {
			sess, err1 := dp.CreateSession("bench")
			h, err2 := dp.NewHandle(dataplane.HandleRef{}, time.Time{})
			if err := errors.Join(err1, err2); err != nil {
				dp.Uninstall()
				return nil, err
			}
			return &sink{
				Dataplane: dp, desc: "real dataplane (BPF LPM trie write, 3 bpf(2) calls, per written entry)",
				session: sess.Name, index: sess.Index, handle: h, dp: dp, sess: sess,
				count: func() int { r, _ := dp.EgressRules(sess.Name); return len(r) },
				close: func() {
					if err := dp.Uninstall(); err != nil {
						log.Printf("uninstall dataplane: %v", err)
					}
				},
			}, nil
		}
		if mode == "on" {
			return nil, fmt.Errorf("open dataplane: %w", err)
		}
		log.Printf("no dataplane (%v): entry writes go to an in-memory sink", err)
	}
	m := &memSink{m: map[netip.Prefix]dataplane.EgressRule{}}
	return &sink{
		Dataplane: m, desc: "in-memory sink (NOT a kernel map write)",
		session: "bench", index: 1, handle: dataplane.HandleRef{Slot: 1, Generation: 1},
		count: func() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.m) },
		close: func() {},
	}, nil
}

// ---- dnsmasq ----

type peer struct {
	cmd  *exec.Cmd
	addr netip.AddrPort
	dir  string
}

func freePort() (uint16, error) {
	// A port free for both UDP and TCP on 127.0.0.1.
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		pc.Close()
		if err == nil {
			ln.Close()
			return uint16(port), nil
		}
	}
	return 0, errors.New("no free port")
}

func startDnsmasq(bin string, up netip.AddrPort, cache int, nftset string) (*peer, error) {
	dir, err := os.MkdirTemp("", "shinken-bench-dnsmasq-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	extra := ""
	if nftset != "" {
		extra = "nftset=/allowed.bench/" + nftset + "\n"
	}
	conf := fmt.Sprintf(`# written by bench/dns; loopback only
port=%d
listen-address=127.0.0.1
bind-interfaces
no-resolv
no-hosts
no-poll
no-negcache
server=/allowed.bench/%s#%d
cache-size=%d
dns-forward-max=1000
%s`, port, up.Addr(), up.Port(), cache, extra)
	cf := filepath.Join(dir, "dnsmasq.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--keep-in-foreground", "--conf-file="+cf, "--pid-file="+filepath.Join(dir, "pid"), "--log-facility=-")
	cmd.Stderr = io.Discard
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &peer{cmd: cmd, addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), dir: dir}
	// Wait until it answers.
	m := new(dns.Msg)
	m.SetQuestion("n0.allowed.bench.", dns.TypeA)
	for i := 0; ; i++ {
		if _, _, err := (&dns.Client{Timeout: 200 * time.Millisecond}).Exchange(m, p.addr.String()); err == nil {
			break
		}
		if i == 50 {
			p.stop()
			return nil, errors.New("dnsmasq does not answer")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return p, nil
}

// stop kills the dnsmasq this program started, by its pid.
func (p *peer) stop() {
	if p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(p.dir)
}

// ---- load ----

type result struct {
	n, errs int
	wrong   int // unexpected rcode
	lat     []time.Duration
	elapsed time.Duration
}

func (r *result) add(o result) {
	r.n += o.n
	r.errs += o.errs
	r.wrong += o.wrong
	r.lat = append(r.lat, o.lat...)
	r.elapsed += o.elapsed
}

func (r *result) qps() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r *result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	return r.lat[min(len(r.lat)-1, int(float64(len(r.lat))*p))]
}

// pack prepares one wire query per name.
func pack(names []string) [][]byte {
	out := make([][]byte, len(names))
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, dns.TypeA)
		out[i], _ = m.Pack()
	}
	return out
}

// load runs conc closed-loop clients against target for d.
func load(target netip.AddrPort, queries [][]byte, wantRcode int, conc int, d time.Duration) (result, error) {
	var (
		mu    sync.Mutex
		total result
		wg    sync.WaitGroup
		ferr  error
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, net.UDPAddrFromAddrPort(target))
			if err != nil {
				mu.Lock()
				ferr = err
				mu.Unlock()
				return
			}
			defer c.Close()
			var r result
			r.lat = make([]time.Duration, 0, 1<<16)
			buf := make([]byte, 1500)
			q := make([]byte, 512)
			var idb [2]byte
			for i := w; ; i++ {
				t0 := time.Now()
				if !t0.Before(deadline) {
					break
				}
				qq := queries[i%len(queries)]
				q = append(q[:0], qq...)
				rand.Read(idb[:])
				copy(q, idb[:])
				c.SetReadDeadline(t0.Add(2 * time.Second))
				if _, err := c.Write(q); err != nil {
					r.errs++
					continue
				}
				for {
					n, err := c.Read(buf)
					if err != nil {
						r.errs++
						break
					}
					if n < 12 || buf[0] != idb[0] || buf[1] != idb[1] {
						continue // stale reply of a timed-out query
					}
					r.lat = append(r.lat, time.Since(t0))
					r.n++
					if int(buf[3]&0xf) != wantRcode {
						r.wrong++
					}
					break
				}
			}
			mu.Lock()
			total.add(r)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.elapsed = time.Since(start)
	return total, ferr
}

// clientMain is the load generator, a separate process so that it never
// shares a Go scheduler or garbage collector with the resolver under test.
// Arguments: TARGET NAMEFILE RCODE CONC DURATION; it writes n, errs, wrong,
// elapsed and then every latency (ns) as little-endian int64s on stdout.
func clientMain() {
	a := flag.Args()
	target := netip.MustParseAddrPort(a[0])
	data, err := os.ReadFile(a[1])
	if err != nil {
		log.Fatal(err)
	}
	var rcode, conc int
	fmt.Sscan(a[2], &rcode)
	fmt.Sscan(a[3], &conc)
	d, _ := time.ParseDuration(a[4])
	r, err := load(target, pack(strings.Fields(string(data))), rcode, conc, d)
	if err != nil {
		log.Fatal(err)
	}
	w := bufio.NewWriter(os.Stdout)
	for _, v := range []int64{int64(r.n), int64(r.errs), int64(r.wrong), int64(r.elapsed)} {
		binary.Write(w, binary.LittleEndian, v)
	}
	for _, l := range r.lat {
		binary.Write(w, binary.LittleEndian, int64(l))
	}
	w.Flush()
}

// runClient runs one scenario in a client process.
func runClient(target netip.AddrPort, nameFile string, rcode, conc int, d time.Duration, in *dataplane.Session) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	cmd := exec.Command(self, target.String(), nameFile, fmt.Sprint(rcode), fmt.Sprint(conc), d.String())
	cmd.Env = append(os.Environ(), clientEnv+"=1", "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	if in != nil {
		// Inside the session: its port-53 traffic is redirected by the kernel.
		err = dataplane.StartIn(*in, cmd, dataplane.ProcOptions{Privileged: true})
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return result{}, fmt.Errorf("client: %w", err)
	}
	out, err := io.ReadAll(stdout)
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err != nil {
		return result{}, fmt.Errorf("client: %w", err)
	}
	if len(out) < 32 || len(out)%8 != 0 {
		return result{}, fmt.Errorf("client: %d bytes of output", len(out))
	}
	v := func(i int) int64 { return int64(binary.LittleEndian.Uint64(out[8*i:])) }
	r := result{n: int(v(0)), errs: int(v(1)), wrong: int(v(2)), elapsed: time.Duration(v(3))}
	for i := 4; i < len(out)/8; i++ {
		r.lat = append(r.lat, time.Duration(v(i)))
	}
	return r, nil
}

// startShinken starts one resolver instance writing into sk.
func startShinken(sk *sink, up netip.AddrPort, cacheSize int, alwaysWrite bool) (*dnsresolver.Resolver, netip.AddrPort, error) {
	res, err := dnsresolver.New(dnsresolver.Config{
		Dataplane: sk,
		SessionName: func(i uint32) (string, bool) {
			if i == sk.index {
				return sk.session, true
			}
			return "", false
		},
		ListenAddr:  netip.MustParseAddrPort("0.0.0.0:0"),
		Upstreams:   []netip.AddrPort{up},
		CacheSize:   cacheSize,
		AlwaysWrite: alwaysWrite,
		UDPWorkers:  *flagWorkers,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	if err := res.SetPolicy(sk.session, dnsresolver.Policy{Grants: []dnsresolver.Grant{
		{Pattern: "**.allowed.bench", Handle: sk.handle, Proto: dataplane.ProtoTCP, Ports: dataplane.Port(443)},
	}}); err != nil {
		return nil, netip.AddrPort{}, err
	}
	if err := res.Start(); err != nil {
		return nil, netip.AddrPort{}, err
	}
	return res, netip.AddrPortFrom(dnsresolver.SessionAddr(sk.index), res.Port()), nil
}

// nftSet makes a private nftables table holding one IPv4 set with
// timeouts, for dnsmasq's --nftset; it has no chain, so it filters nothing.
// The returned func deletes it.
func nftSet() (string, func(), error) {
	b := make([]byte, 4)
	rand.Read(b)
	table := "shinken_benchdns_" + hex.EncodeToString(b)
	script := fmt.Sprintf("add table inet %s\nadd set inet %s allowed { type ipv4_addr; flags timeout; timeout 5m; }\n", table, table)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("nft: %v: %s", err, out)
	}
	return "4#inet#" + table + "#allowed", func() {
		if out, err := exec.Command("nft", "delete", "table", "inet", table).CombinedOutput(); err != nil {
			log.Printf("nft delete table %s: %v: %s", table, err, out)
		}
	}, nil
}

func run() error {
	up, err := startUpstreamProc()
	if err != nil {
		return err
	}
	upStopped := false
	defer func() {
		if !upStopped {
			up.stop()
		}
	}()

	sk, err := openSink(*flagDP)
	if err != nil {
		return err
	}
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		cleanups = nil
	}
	defer cleanup()
	cleanups = append(cleanups, sk.close)
	// Clean up on ^C too.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; cleanup(); os.Exit(1) }()

	// Shinken: default (cache; an entry already written with the same
	// expiry is not written again), always-write (cache; every answer
	// writes its entry), no cache (every query goes upstream and writes).
	var targets [3]netip.AddrPort
	for i, c := range []struct {
		cache  int
		always bool
	}{{0, false}, {0, true}, {-1, false}} {
		res, t, err := startShinken(sk, up.addr, c.cache, c.always)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, func() { res.Close() })
		targets[i] = t
	}
	shinken, shinkenAlways, shinkenNoCache := targets[0], targets[1], targets[2]

	// dnsmasq: cached, and uncached with --nftset (its "answer + set write").
	pr, err := startDnsmasq(*flagDnsmasq, up.addr, 10000, "")
	if err != nil {
		return err
	}
	cleanups = append(cleanups, pr.stop)
	set, delSet, err := nftSet()
	nftDesc := "+nftset"
	if err != nil {
		log.Printf("no nftables set (%v): the uncached dnsmasq runs without --nftset", err)
		set, nftDesc = "", ""
	} else {
		cleanups = append(cleanups, delSet)
	}
	prNoCache, err := startDnsmasq(*flagDnsmasq, up.addr, 0, set)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, prNoCache.stop)

	var allowed, refused []string
	for i := range *flagNames {
		allowed = append(allowed, fmt.Sprintf("n%d.allowed.bench.", i))
		refused = append(refused, fmt.Sprintf("x%d.notallowed.bench.", i))
	}
	qa := pack(allowed)
	tmp, err := os.MkdirTemp("", "shinken-bench-dns-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	fa, fr := filepath.Join(tmp, "allowed"), filepath.Join(tmp, "refused")
	if err := errors.Join(os.WriteFile(fa, []byte(strings.Join(allowed, "\n")), 0o644),
		os.WriteFile(fr, []byte(strings.Join(refused, "\n")), 0o644)); err != nil {
		return err
	}

	// Warm the caches (and write every entry once); check every answer.
	for _, t := range []netip.AddrPort{shinken, shinkenAlways, shinkenNoCache, pr.addr, prNoCache.addr} {
		for _, q := range qa {
			m := new(dns.Msg)
			m.Unpack(q)
			r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, t.String())
			if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
				return fmt.Errorf("warm-up %s %s: %v %v", t, m.Question[0].Name, r, err)
			}
		}
	}
	// Check the refused path of both before measuring.
	for _, t := range []netip.AddrPort{shinken, pr.addr} {
		m := new(dns.Msg)
		m.SetQuestion(refused[0], dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, t.String())
		if err != nil || r.Rcode != dns.RcodeRefused {
			return fmt.Errorf("refused check %s: %v %v", t, r, err)
		}
	}
	if set != "" {
		out, _ := exec.Command("nft", "list", "set", "inet", strings.Split(set, "#")[2], "allowed").CombinedOutput()
		if n := strings.Count(string(out), "93.184."); n < *flagNames {
			return fmt.Errorf("dnsmasq --nftset wrote %d of %d addresses", n, *flagNames)
		}
	}
	st0 := sk.writes()

	type scen struct {
		name   string
		target netip.AddrPort
		names  string
		rcode  int
		res    result
		cpu    time.Duration // server CPU (user+system) during the scenario
		cpuOf  func() time.Duration
		in     *dataplane.Session // run the clients inside this session
	}
	scens := []*scen{
		{name: "shinken/allowed", target: shinken, names: fa, rcode: dns.RcodeSuccess, cpuOf: selfCPU},
		{name: "dnsmasq/allowed", target: pr.addr, names: fa, rcode: dns.RcodeSuccess, cpuOf: pr.cpu},
		{name: "shinken/allowed-alwayswrite", target: shinkenAlways, names: fa, rcode: dns.RcodeSuccess, cpuOf: selfCPU},
		{name: "shinken/allowed-nocache", target: shinkenNoCache, names: fa, rcode: dns.RcodeSuccess, cpuOf: selfCPU},
		{name: "dnsmasq/allowed-nocache" + nftDesc, target: prNoCache.addr, names: fa, rcode: dns.RcodeSuccess, cpuOf: prNoCache.cpu},
		{name: "shinken/refused", target: shinken, names: fr, rcode: dns.RcodeRefused, cpuOf: selfCPU},
		{name: "dnsmasq/refused", target: pr.addr, names: fr, rcode: dns.RcodeRefused, cpuOf: pr.cpu},
	}
	if sk.dp != nil {
		// The same default resolver, reached the way a session reaches it:
		// clients inside the session query 127.0.0.53:53 and the kernel
		// redirects them (connect4 rewrite, recvmsg restore).
		if err := sk.dp.SetDNSRedirect(shinken.Port()); err != nil {
			return err
		}
		scens = slices.Insert(scens, 1, &scen{name: "shinken/allowed-via-redirect", target: netip.MustParseAddrPort("127.0.0.53:53"),
			names: fa, rcode: dns.RcodeSuccess, cpuOf: selfCPU, in: &sk.sess})
	}
	fmt.Printf("bench-dns: %d clients (separate process), %d interleaved rounds x %v per scenario, %d names, upstream delay %v\n",
		*flagConc, *flagRounds, *flagDur, *flagNames, *flagUpstream)
	fmt.Printf("entry writes: %s\n", sk.desc)
	fmt.Printf("host: %d CPUs (GOMAXPROCS %d), load average %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), loadavg())
	for round := range *flagRounds {
		for _, s := range scens {
			prof := *flagProfile != "" && round == 0 && s == scens[0]
			if prof {
				f, err := os.Create(*flagProfile)
				if err != nil {
					return err
				}
				pprof.StartCPUProfile(f)
				defer f.Close()
			}
			c0 := s.cpuOf()
			r, err := runClient(s.target, s.names, s.rcode, *flagConc, *flagDur, s.in)
			s.cpu += s.cpuOf() - c0
			if prof {
				pprof.StopCPUProfile()
			}
			if err != nil {
				return err
			}
			s.res.add(r)
		}
	}
	byName := func(n string) *scen {
		for _, s := range scens {
			if s.name == n {
				return s
			}
		}
		panic(n)
	}
	fmt.Printf("%-32s %10s %9s %9s %9s %12s %7s %7s\n", "scenario", "queries/s", "p50_us", "p99_us", "p999_us", "cpu_us/query", "errors", "wrong")
	for _, s := range scens {
		r := &s.res
		fmt.Printf("%-32s %10.0f %9.1f %9.1f %9.1f %12.2f %7d %7d\n", s.name, r.qps(),
			us(r.pct(0.50)), us(r.pct(0.99)), us(r.pct(0.999)), us(s.cpu)/float64(max(r.n, 1)), r.errs, r.wrong)
	}
	fmt.Printf("entry writes during measurement: %d (alwayswrite + nocache scenarios; the default skips rewrites)\n", sk.writes()-st0)
	cleanup() // resolvers, dnsmasq, nftables set, dataplane
	upStopped = true
	fmt.Printf("fake upstream queries, warm-up included: %d (separate process)\n", up.stop())
	fmt.Printf("load average after: %s\n", loadavg())
	fmt.Printf("dns_qps_ratio_vs_peer=%.3f\n", byName("shinken/allowed").res.qps()/byName("dnsmasq/allowed").res.qps())
	fmt.Printf("dns_p99_us=%.1f\n", us(byName("shinken/allowed").res.pct(0.99)))
	return nil
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// selfCPU is this process's CPU time: the resolver (the clients run in
// their own processes; the fake upstream is idle once the caches are warm).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpu is dnsmasq's CPU time, from /proc/PID/stat.
func (p *peer) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
