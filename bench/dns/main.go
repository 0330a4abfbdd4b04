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
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/dataplane"
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
	flagDecide   = flag.Bool("decide", true, "give the resolver the agent's use-time decision (a Cedar engine with the shipped policies and the session's grant), as the daemon does; the full path asks it per name")
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

func run() error {
	up, err := benchkit.StartChild(upstreamEnv, "-upstream-delay", flagUpstream.String())
	if err != nil {
		return err
	}
	upStopped := false
	defer func() {
		if !upStopped {
			up.Stop()
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
		res, t, err := startShinken(sk, up.Addr, c.cache, c.always)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, func() { res.Close() })
		targets[i] = t
	}
	shinken, shinkenAlways, shinkenNoCache := targets[0], targets[1], targets[2]

	// dnsmasq: cached, and uncached with --nftset (its "answer + set write").
	pr, err := startDnsmasq(*flagDnsmasq, up.Addr, 10000, "")
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
	prNoCache, err := startDnsmasq(*flagDnsmasq, up.Addr, 0, set)
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
	fmt.Printf("host: %d CPUs (GOMAXPROCS %d), load average %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), benchkit.LoadAvg())
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
	fmt.Printf("fake upstream queries, warm-up included: %d (separate process)\n", up.Stop())
	fmt.Printf("load average after: %s\n", benchkit.LoadAvg())
	fmt.Printf("dns_qps_ratio_vs_peer=%.3f\n", byName("shinken/allowed").res.qps()/byName("dnsmasq/allowed").res.qps())
	fmt.Printf("dns_p99_us=%.1f\n", us(byName("shinken/allowed").res.pct(0.99)))
	return nil
}

// selfCPU is this process's CPU time: the resolver (the clients run in
// their own processes; the fake upstream is idle once the caches are warm).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
