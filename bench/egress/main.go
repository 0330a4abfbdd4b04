//go:build linux

// Command egress is the egress dataplane benchmark (make bench-egress). In one
// run, on one machine, it measures:
//
//   - connect()+close() rate from inside a session while 10,000 sessions x 100
//     entries are loaded, against the same workload in a cgroup with nothing
//     attached (baseline) and in a cgroup matched by nftables (socket
//     cgroupv2 + a named set holding the same entries);
//   - revoke latency: from the revoke's map write returning to the first EPERM seen by a tight
//     connect loop in another process, over many revokes;
//   - the throughput of one TCP stream inside a session (per-packet handle
//     check) against the same stream in the baseline cgroup;
//   - the cost of creating a session at 10 and at 10,000 sessions.
//
// One worker process runs every connect round, moved into the contender's
// cgroup before each and pinned to CPU 0 (the accept server to CPU 1);
// rounds are short, interleaved in rotating order and
// preceded by the same idle pause, and the figure is the median of per-round
// ratios with its 95 % confidence interval. A twin of the baseline (a second
// empty cgroup) runs the same rounds: its ratio to the baseline is the
// method's own floor, printed in every run. It cleans up every cgroup, pin
// and nftables table it made, also when interrupted.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/probe"
	"golang.org/x/sys/unix"
)

var (
	flagSessions = flag.Int("sessions", 10000, "sessions loaded")
	flagEntries  = flag.Int("entries", 100, "egress entries per session")
	flagRounds   = flag.Int("rounds", 60, "interleaved rounds per contender")
	flagSecs     = flag.Float64("secs", 0.25, "seconds per connect round")
	flagNoTwin   = flag.Bool("no-twin", false, "skip the baseline twin (the bench's own A/A floor)")
	flagSettle   = flag.Duration("settle", 50*time.Millisecond, "idle pause before every connect round (after the move and any nftables change)")
	flagPin      = flag.Bool("pin", true, "connect rounds: worker on CPU 0, accept server on CPU 1 (machines with 2+ CPUs)")
	flagOrder    = flag.String("order", "", "cyclic order of the contenders, e.g. baseline,twin,shinken,nftables (default: that of the code)")
	flagRevokes  = flag.Int("revokes", 1000, "revokes timed")
	flagStream   = flag.Float64("stream-secs", 2, "seconds per stream round")
	flagNoNft    = flag.Bool("no-nft", false, "skip the nftables contender")
	flagFlowMode = flag.String("flow-mode", "auto", "Shinken's flow mode: auto, sweep or packet")
)

func main() {
	boundary.Main() // the launcher's fallback: this binary re-executed
	if os.Getenv(spinEnv) != "" {
		spinMain()
	}
	if os.Getenv(probe.EnvVar) != "" {
		probe.Main()
	}
	flag.Parse()
	log.SetFlags(0)
	if os.Geteuid() != 0 {
		log.Fatal("bench-egress needs root")
	}
	b := &bench{}
	// Interrupted (Ctrl-C, timeout), the bench still removes its 10,000
	// cgroups, its pins and its nftables table; a second signal kills it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sig
		signal.Reset()
		log.Printf("%v: cleaning up", s)
		b.cleanup()
		os.Exit(130)
	}()
	defer b.cleanup()
	if err := b.run(); err != nil {
		b.cleanup()
		log.Fatal(err)
	}
}

type bench struct {
	dp        *dataplane.Dataplane
	root      string // cgroup2 mount
	tag       string
	baseCg    string
	twinCg    string // the baseline's twin (A/A floor)
	nftParent string
	nftTable  string
	nftChain  string // script that adds the output chain and its rules
	probeDir  string
	mu        sync.Mutex // guards procs
	procs     []*worker
	once      sync.Once
}

// cleanup runs once, whoever calls it first (the run's end or a signal);
// a concurrent caller waits for it to finish. It leaves the fields as they
// are: a run still going on another goroutine then fails on a closed
// dataplane instead of a nil one.
func (b *bench) cleanup() { b.once.Do(b.doCleanup) }

func (b *bench) doCleanup() {
	b.mu.Lock()
	procs := b.procs
	b.mu.Unlock()
	for _, w := range procs {
		w.stop()
	}
	if b.nftTable != "" {
		exec.Command("nft", "delete", "table", "inet", b.nftTable).Run()
	}
	if b.dp != nil {
		if err := b.dp.Uninstall(); err != nil {
			log.Printf("uninstall: %v", err)
		}
	}
	if b.nftParent != "" {
		ents, _ := os.ReadDir(b.nftParent)
		for _, e := range ents {
			if e.IsDir() {
				rmCgroup(filepath.Join(b.nftParent, e.Name()))
			}
		}
		rmCgroup(b.nftParent)
	}
	for _, cg := range []string{b.baseCg, b.twinCg} {
		if cg != "" {
			rmCgroup(cg)
		}
	}
	if b.probeDir != "" {
		os.RemoveAll(b.probeDir)
	}
}

func rmCgroup(p string) {
	os.WriteFile(filepath.Join(p, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 200; i++ {
		if err := os.Remove(p); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *bench) run() error {
	var err error
	if b.root, err = dataplane.FindCgroup2Mount(); err != nil {
		return err
	}
	tb := make([]byte, 3)
	rand.Read(tb)
	b.tag = hex.EncodeToString(tb)
	if err := b.copyProbe(); err != nil {
		return err
	}

	host, _ := os.Hostname()
	cpu := cpuModel()
	fmt.Printf("machine: %s, %s, %d CPUs, kernel %s\n", host, cpu, numCPU(), kernelRelease())
	fmt.Printf("load: %d sessions x %d entries\n", *flagSessions, *flagEntries)

	// Shinken: the dataplane with the load.
	mode, err := dataplane.ParseFlowMode(*flagFlowMode)
	if err != nil {
		return err
	}
	b.dp, err = dataplane.Open(dataplane.Config{
		Parent: "shinken-bench-" + b.tag, PinPath: "/sys/fs/bpf/shinken-bench-" + b.tag,
		MaxSessions: uint32(*flagSessions + 64), MaxHandles: uint32(*flagRevokes + 64),
		MaxEgress4: uint32(*flagSessions**flagEntries + 1024), FlowMode: mode,
		Boundary: boundaryConfig(),
	})
	if err != nil {
		return err
	}
	fmt.Printf("shinken flow mode: %s\n", b.dp.FlowMode())
	fmt.Printf("session boundary: %s; launcher: %s\n", b.dp.Probe().Facts["session_boundary"], b.dp.Probe().Facts["session_launcher"])
	load, err := b.dp.NewHandle(dataplane.HandleRef{}, time.Time{})
	if err != nil {
		return err
	}
	// Session create cost at 10 sessions...
	var at10 []float64
	for i := 0; i < *flagSessions; i++ {
		name := fmt.Sprintf("s%d", i)
		t0 := time.Now()
		if _, err := b.dp.CreateSession(name, dataplane.Limits{}); err != nil {
			return err
		}
		if i < 10 {
			at10 = append(at10, float64(time.Since(t0).Microseconds()))
		}
		for j := 0; j < *flagEntries; j++ {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(j)})
			if err := b.dp.AllowEgress(name, dataplane.EgressRule{Prefix: netip.PrefixFrom(a, 32), Proto: dataplane.ProtoTCP, Ports: dataplane.Port(443), Handle: load}); err != nil {
				return err
			}
		}
	}
	// ... and at 10,000.
	var at10k []float64
	for i := 0; i < 10; i++ {
		t0 := time.Now()
		if _, err := b.dp.CreateSession(fmt.Sprintf("late%d", i), dataplane.Limits{}); err != nil {
			return err
		}
		at10k = append(at10k, float64(time.Since(t0).Microseconds()))
	}

	// The servers, outside every session.
	// With -pin the worker runs on CPU 0 and the accept server on CPU 1.
	// Unpinned, the worker was off its CPU for 10-15 % of each round, by an
	// amount that varied from round to round (bench/README.md).
	srvCPU := -1
	if *flagPin && numCPU() > 1 {
		srvCPU = 1
	}
	connSrv, err := acceptAndClose(netip.MustParseAddrPort("127.0.0.2:0"), srvCPU)
	if err != nil {
		return err
	}
	sink, err := discard("127.0.0.2:0")
	if err != nil {
		return err
	}
	defer connSrv.Close()
	defer sink.Close()
	connAddr := connSrv.addr
	sinkAddr := netip.MustParseAddrPort(sink.Addr().String())

	bs, err := b.dp.CreateSession("bench", dataplane.Limits{})
	if err != nil {
		return err
	}
	// The bench session carries the same 100 entries as every other one.
	for j := 0; j < *flagEntries; j++ {
		a := netip.AddrFrom4([4]byte{11, 0, 0, byte(j)})
		if err := b.dp.AllowEgress("bench", dataplane.EgressRule{Prefix: netip.PrefixFrom(a, 32), Proto: dataplane.ProtoTCP, Ports: dataplane.Port(443), Handle: load}); err != nil {
			return err
		}
	}
	for _, ap := range []netip.AddrPort{connAddr, sinkAddr} {
		if err := b.dp.AllowEgress("bench", dataplane.EgressRule{Prefix: netip.PrefixFrom(ap.Addr(), 32), Proto: dataplane.ProtoTCP, Ports: dataplane.Port(ap.Port()), Handle: load}); err != nil {
			return err
		}
	}

	// Baseline: a cgroup with nothing attached. Its twin, a second empty
	// cgroup that runs the same rounds, measures the bench's own floor (an
	// A/A comparison): the ratio the method reports when nothing differs.
	b.baseCg = filepath.Join(b.root, "shinken-bench-base-"+b.tag)
	if err := os.Mkdir(b.baseCg, 0o755); err != nil {
		return err
	}
	if !*flagNoTwin {
		b.twinCg = filepath.Join(b.root, "shinken-bench-twin-"+b.tag)
		if err := os.Mkdir(b.twinCg, 0o755); err != nil {
			return err
		}
	}
	var nftSess dataplane.Session
	if !*flagNoNft {
		if nftSess, err = b.setupNft(connAddr, sinkAddr); err != nil {
			return fmt.Errorf("nftables contender: %w", err)
		}
	}

	wShk, err := b.worker(bs)
	if err != nil {
		return err
	}
	var wNft *worker
	if !*flagNoNft {
		if wNft, err = b.worker(nftSess); err != nil {
			return err
		}
	}

	// Sanity: the Shinken session is really enforced.
	if got := wShk.do("tcp 127.0.0.3:" + strconv.Itoa(int(connAddr.Port()))); got != "err EPERM" {
		return fmt.Errorf("bench session is not enforced: %s", got)
	}
	if wNft != nil {
		if err := b.nftOn(); err != nil {
			return err
		}
		got := wNft.do("tcp 127.0.0.3:" + strconv.Itoa(int(connAddr.Port())))
		if err := b.nftOff(); err != nil {
			return err
		}
		if got != "err ECONNREFUSED" {
			return fmt.Errorf("nftables session is not enforced: %s", got)
		}
	}

	// One worker process runs every contender's rounds: before each round
	// the bench moves it into that contender's cgroup (sockets belong to the
	// cgroup of the task that creates them). Separate processes per
	// contender showed a bias of their own that held for a whole run (up to
	// ±8 %, either way, with the same code).
	// It starts through the launcher in the bench session (uid, seccomp
	// filter, namespaces), and keeps all of that when it is moved.
	wAll, err := b.worker(bs)
	if err != nil {
		return err
	}
	// The worker's command thread does the work (probe.Main locks it).
	var wTid int
	if _, err := fmt.Sscanf(wAll.do("tid"), "ok %d", &wTid); err != nil {
		return fmt.Errorf("worker thread id: %w", err)
	}
	wTid = hostTID(wAll.cmd.Process.Pid, wTid)
	var allCPUs unix.CPUSet
	if err := unix.SchedGetaffinity(wTid, &allCPUs); err != nil {
		return err
	}
	if srvCPU >= 0 {
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(wTid, &set); err != nil {
			return fmt.Errorf("pin the worker to CPU 0: %w", err)
		}
	}
	moveTo := func(cg string) error {
		return os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(wAll.cmd.Process.Pid)), 0)
	}
	shkCg, nftCg := bs.Path, nftSess.Path

	// Connect rate, interleaved rounds in rotating order. On a shared
	// machine the load drifts from round to round, so the ratio reported is
	// the median of per-round ratios (each pair measured within one round of
	// all contenders), not a ratio of medians, with a distribution-free 95 %
	// confidence interval. Many short rounds pair the contenders closer in
	// time than a few long ones. CPU-normalised rates (connects per
	// CPU-second of the worker, kernel time included) are printed beside
	// them, and the twin's ratio to the baseline is the method's own floor.
	type contender struct {
		name      string
		cg        string
		nft       bool
		rate, cpu []float64
	}
	cBase := &contender{name: "baseline", cg: b.baseCg}
	cShk := &contender{name: "shinken", cg: shkCg}
	cs := []*contender{cBase, cShk}
	var cTwin, cNft *contender
	if b.twinCg != "" {
		cTwin = &contender{name: "twin", cg: b.twinCg}
		cs = append(cs, cTwin)
	}
	if wNft != nil {
		cNft = &contender{name: "nftables", cg: nftCg, nft: true}
		cs = append(cs, cNft)
	}
	if *flagOrder != "" {
		var ordered []*contender
		for _, n := range strings.Split(*flagOrder, ",") {
			for _, c := range cs {
				if c.name == n {
					ordered = append(ordered, c)
				}
			}
		}
		if len(ordered) != len(cs) {
			return fmt.Errorf("-order %q does not name each contender once", *flagOrder)
		}
		cs = ordered
	}
	flood := fmt.Sprintf("tcpflood 0 %s %g", connAddr, *flagSecs)
	for r := 0; r < *flagRounds; r++ {
		for i := range cs {
			c := cs[(i+r)%len(cs)]
			if err := moveTo(c.cg); err != nil {
				return fmt.Errorf("move the worker to %s: %w", c.cg, err)
			}
			if c.nft {
				if err := b.nftOn(); err != nil {
					return err
				}
			}
			time.Sleep(*flagSettle)
			line := wAll.do(flood)
			if c.nft {
				if err := b.nftOff(); err != nil {
					return err
				}
			}
			c.rate = append(c.rate, rate(line))
			c.cpu = append(c.cpu, cpuRate(line))
		}
	}
	fmt.Printf("connect+close per second, %d rounds of %gs, median of rounds:", *flagRounds, *flagSecs)
	for _, c := range cs {
		fmt.Printf("  %s %.0f", c.name, median(c.rate))
	}
	fmt.Printf("\n  per CPU-second of the worker:")
	for _, c := range cs {
		fmt.Printf("  %s %.0f", c.name, median(c.cpu))
	}
	fmt.Println()
	pairBase := pairs(cShk.rate, cBase.rate)
	report := func(what string, v []float64) {
		lo, hi := medianCI(v)
		q := append([]float64(nil), v...)
		sort.Float64s(q)
		fmt.Printf("  per-round ratio %s: median %.3f, 95%% CI %.3f–%.3f, quartiles %.3f %.3f, min %.3f max %.3f\n",
			what, median(v), lo, hi, pct(q, 25), pct(q, 75), q[0], q[len(q)-1])
	}
	report("shinken/baseline", pairBase)
	fmt.Printf("    CPU-normalised: median %.3f\n", median(pairs(cShk.cpu, cBase.cpu)))
	var pairNft []float64
	if cNft != nil {
		pairNft = pairs(cShk.rate, cNft.rate)
		report("shinken/nftables", pairNft)
		fmt.Printf("    CPU-normalised: median %.3f\n", median(pairs(cShk.cpu, cNft.cpu)))
	}
	if cTwin != nil {
		report("twin/baseline (the bench's floor: nothing differs)", pairs(cTwin.rate, cBase.rate))
		fmt.Printf("    CPU-normalised: median %.3f\n", median(pairs(cTwin.cpu, cBase.cpu)))
	}

	// The other phases place their threads themselves, or not at all.
	if err := unix.SchedSetaffinity(wTid, &allCPUs); err != nil {
		return err
	}

	// Stream throughput, paired rounds likewise.
	var sBase, sShk, sPair []float64
	stream := fmt.Sprintf("stream %s %g", sinkAddr, *flagStream)
	streamIn := func(cg string) (float64, error) {
		if err := moveTo(cg); err != nil {
			return 0, fmt.Errorf("move the worker to %s: %w", cg, err)
		}
		return rate(wAll.do(stream)), nil
	}
	for r := 0; r < 5; r++ {
		order := []string{b.baseCg, shkCg}
		if r%2 == 1 {
			order = []string{shkCg, b.baseCg}
		}
		for _, cg := range order {
			v, err := streamIn(cg)
			if err != nil {
				return err
			}
			if cg == shkCg {
				sShk = append(sShk, v)
			} else {
				sBase = append(sBase, v)
			}
		}
		sPair = append(sPair, sShk[r]/sBase[r])
	}
	fmt.Printf("one TCP stream, MB/s, 5 rounds of %gs: median baseline %.0f  shinken %.0f; per-round ratio median %.3f, rounds %v\n",
		*flagStream, median(sBase)/1e6, median(sShk)/1e6, median(sPair), fmts(sPair))

	// The seccomp filter's cost per syscall.
	filterLen, err := boundary.FilterLen(false)
	if err != nil {
		return err
	}
	scDiff, scIn, scOut, err := b.seccompCost(bs, max(6, *flagRounds/6))
	if err != nil {
		return err
	}
	fmt.Printf("getppid, ns per call, %d interleaved rounds of 2,000,000: launched (filter of %d instructions, Landlock, session uid) %.1f, unconfined %.1f; median per-round difference %.1f\n",
		max(6, *flagRounds/6), filterLen, scIn, scOut, scDiff)

	// Revoke latency.
	lat, whole, err := b.revokeLatency()
	if err != nil {
		return err
	}
	sort.Float64s(lat)
	sort.Float64s(whole)
	fmt.Printf("revoke -> first denied connect, %d revokes: p50 %.1fus  p90 %.1fus  p99 %.1fus  max %.1fus\n",
		len(lat), pct(lat, 50), pct(lat, 90), pct(lat, 99), lat[len(lat)-1])
	st := b.dp.SweepStats()
	fmt.Printf("Revoke call, whole (map write + cutting open flows, %s mode; %d TCP+UDP sockets on the host): p50 %.1fus  p99 %.1fus; sweeps %d, sockets destroyed %d\n",
		b.dp.FlowMode(), hostSockets(), pct(whole, 50), pct(whole, 99), st.Sweeps, st.Destroyed)
	fmt.Printf("session create, mean of 10: at 10 sessions %.1fus, at %d sessions %.1fus\n", mean(at10), *flagSessions, mean(at10k))

	ratioNft := median(pairNft)
	fmt.Printf("session_create_us_at_10=%.1f\n", mean(at10))
	fmt.Printf("session_create_us_at_10k=%.1f\n", mean(at10k))
	fmt.Printf("seccomp_filter_instructions=%d\n", filterLen)
	fmt.Printf("seccomp_ns_per_syscall=%.1f\n", scDiff)
	fmt.Printf("egress_connect_ratio_vs_baseline=%.3f\n", median(pairBase))
	fmt.Printf("egress_connect_ratio_vs_nftables=%.3f\n", ratioNft)
	fmt.Printf("revoke_to_deny_p99_us=%.1f\n", pct(lat, 99))
	fmt.Printf("egress_stream_ratio_vs_baseline=%.3f\n", median(sPair))
	return nil
}
