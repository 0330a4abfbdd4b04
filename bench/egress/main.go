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
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/shinken-agent/shinken/dataplane"
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
	})
	if err != nil {
		return err
	}
	fmt.Printf("shinken flow mode: %s\n", b.dp.FlowMode())
	load, err := b.dp.NewHandle(dataplane.HandleRef{}, time.Time{})
	if err != nil {
		return err
	}
	// Session create cost at 10 sessions...
	var at10 []float64
	for i := 0; i < *flagSessions; i++ {
		name := fmt.Sprintf("s%d", i)
		t0 := time.Now()
		if _, err := b.dp.CreateSession(name); err != nil {
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
		if _, err := b.dp.CreateSession(fmt.Sprintf("late%d", i)); err != nil {
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

	bs, err := b.dp.CreateSession("bench")
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
	base := dataplane.Session{Name: "baseline", Path: b.baseCg}
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
	wAll, err := b.worker(base)
	if err != nil {
		return err
	}
	// The worker's command thread does the work (probe.Main locks it).
	var wTid int
	if _, err := fmt.Sscanf(wAll.do("tid"), "ok %d", &wTid); err != nil {
		return fmt.Errorf("worker thread id: %w", err)
	}
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
	fmt.Printf("egress_connect_ratio_vs_baseline=%.3f\n", median(pairBase))
	fmt.Printf("egress_connect_ratio_vs_nftables=%.3f\n", ratioNft)
	fmt.Printf("revoke_to_deny_p99_us=%.1f\n", pct(lat, 99))
	fmt.Printf("egress_stream_ratio_vs_baseline=%.3f\n", median(sPair))
	return nil
}

// revokeLatency: a worker spins on UDP connect to an allowed destination; the
// bench revokes the handle and takes CLOCK_MONOTONIC as the map write returns; the
// worker reports CLOCK_MONOTONIC of its first EPERM.
func (b *bench) revokeLatency() (lat, whole []float64, err error) {
	s, err := b.dp.CreateSession("revoke")
	if err != nil {
		return nil, nil, err
	}
	w, err := b.worker(s)
	if err != nil {
		return nil, nil, err
	}
	// Worker spins on the last CPU, the revoking thread runs on the first,
	// both SCHED_FIFO so that other load on the machine does not preempt
	// them mid-measurement (the kernel's RT throttling still applies).
	fifo := func(pid int) {
		type schedParam struct{ prio int32 }
		p := schedParam{prio: 10}
		unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(pid), 1 /* SCHED_FIFO */, uintptr(unsafe.Pointer(&p)))
	}
	var tid int
	fmt.Sscanf(w.do("tid"), "ok %d", &tid)
	fifo(tid)
	if n := numCPU(); n > 1 {
		w.do(fmt.Sprintf("cpu %d", n-1))
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(0)
		unix.SchedSetaffinity(0, &set)
	}
	fifo(0)
	defer func() {
		type schedParam struct{ prio int32 }
		p := schedParam{}
		unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, 0, 0 /* SCHED_OTHER */, uintptr(unsafe.Pointer(&p)))
	}()
	dst := netip.MustParseAddrPort("127.0.0.2:9")
	var prev dataplane.EgressRule
	for i := 0; i < *flagRevokes; i++ {
		h, err := b.dp.NewHandle(dataplane.HandleRef{}, time.Time{})
		if err != nil {
			return nil, nil, err
		}
		rule := dataplane.EgressRule{Prefix: netip.PrefixFrom(dst.Addr(), 32), Proto: dataplane.ProtoUDP, Handle: h}
		if err := b.dp.AllowEgress("revoke", rule); err != nil {
			return nil, nil, err
		}
		if !prev.Handle.IsZero() {
			b.dp.RemoveEgress("revoke", prev)
			b.dp.FreeHandle(prev.Handle)
		}
		prev = rule
		if err := w.send("loopudp " + dst.String()); err != nil {
			return nil, nil, err
		}
		time.Sleep(2 * time.Millisecond) // let the loop spin
		var t0 int64
		start := time.Now()
		if err := b.dp.RevokeThen(h, func() { t0 = probe.Monotonic() }); err != nil {
			return nil, nil, err
		}
		whole = append(whole, float64(time.Since(start).Nanoseconds())/1e3)
		line, err := w.recv()
		if err != nil {
			return nil, nil, err
		}
		var t1 int64
		if _, err := fmt.Sscanf(line, "ok %d", &t1); err != nil {
			return nil, nil, fmt.Errorf("loopudp: %s", line)
		}
		us := float64(t1-t0) / 1e3
		if us < 0 {
			us = 0 // denied before the map write's return was stamped
		}
		lat = append(lat, us)
	}
	return lat, whole, nil
}

func (b *bench) setupNft(conn, sink netip.AddrPort) (dataplane.Session, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return dataplane.Session{}, errors.New("nft not found (apt-get install nftables), or run with -no-nft")
	}
	b.nftParent = filepath.Join(b.root, "shinken-bench-nft-"+b.tag)
	if err := os.Mkdir(b.nftParent, 0o755); err != nil {
		return dataplane.Session{}, err
	}
	// nft resolves cgroupv2 paths below /sys/fs/cgroup.
	rel, err := filepath.Rel("/sys/fs/cgroup", b.nftParent)
	if err != nil || strings.HasPrefix(rel, "..") {
		return dataplane.Session{}, fmt.Errorf("cgroup2 at %s is not below /sys/fs/cgroup", b.root)
	}
	level := strings.Count(strings.TrimPrefix(b.nftParent, b.root), "/") + 1
	b.nftTable = "shinken_bench_" + b.tag
	var sb strings.Builder
	fmt.Fprintf(&sb, "table inet %s {\n set allow {\n  typeof socket cgroupv2 level %d . ip daddr . tcp dport\n  size %d\n }\n", b.nftTable, level, *flagSessions**flagEntries+1024)
	sb.WriteString("}\n")
	// The output chain exists only during the nftables rounds (nftOn), so
	// the baseline and Shinken rounds do not pay for its hook. Denied TCP
	// gets a reset (ECONNREFUSED at once) rather than a silent drop that
	// would leave connect() retrying its SYN for minutes.
	b.nftChain = fmt.Sprintf("add chain inet %s out { type filter hook output priority 0; policy accept; }\n", b.nftTable) +
		fmt.Sprintf("add rule inet %s out meta l4proto tcp socket cgroupv2 level %d . ip daddr . tcp dport @allow accept\n", b.nftTable, level) +
		fmt.Sprintf("add rule inet %s out meta l4proto tcp socket cgroupv2 level %d %q reject with tcp reset\n", b.nftTable, level-1, rel) +
		fmt.Sprintf("add rule inet %s out socket cgroupv2 level %d %q drop\n", b.nftTable, level-1, rel)
	if out, err := nftRun(sb.String()); err != nil {
		return dataplane.Session{}, fmt.Errorf("nft: %v: %s", err, out)
	}
	// Sessions and elements, in chunks.
	var elems []string
	flush := func() error {
		if len(elems) == 0 {
			return nil
		}
		script := fmt.Sprintf("add element inet %s allow { %s }\n", b.nftTable, strings.Join(elems, ", "))
		elems = elems[:0]
		if out, err := nftRun(script); err != nil {
			return fmt.Errorf("nft add element: %v: %s", err, out)
		}
		return nil
	}
	for i := 0; i < *flagSessions; i++ {
		name := fmt.Sprintf("s%d", i)
		if err := os.Mkdir(filepath.Join(b.nftParent, name), 0o755); err != nil {
			return dataplane.Session{}, err
		}
		for j := 0; j < *flagEntries; j++ {
			elems = append(elems, fmt.Sprintf("%q . 10.%d.%d.%d . 443", rel+"/"+name, byte(i>>8), byte(i), j))
		}
		if len(elems) >= 20000 {
			if err := flush(); err != nil {
				return dataplane.Session{}, err
			}
		}
	}
	bench := filepath.Join(b.nftParent, "bench")
	if err := os.Mkdir(bench, 0o755); err != nil {
		return dataplane.Session{}, err
	}
	for j := 0; j < *flagEntries; j++ {
		elems = append(elems, fmt.Sprintf("%q . 11.0.0.%d . 443", rel+"/bench", j))
	}
	for _, ap := range []netip.AddrPort{conn, sink} {
		elems = append(elems, fmt.Sprintf("%q . %s . %d", rel+"/bench", ap.Addr(), ap.Port()))
	}
	if err := flush(); err != nil {
		return dataplane.Session{}, err
	}
	return dataplane.Session{Name: "nft-bench", Path: bench}, nil
}

// nftOn adds the output chain (the set stays loaded); nftOff deletes it.
func (b *bench) nftOn() error {
	if out, err := nftRun(b.nftChain); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	return nil
}

func (b *bench) nftOff() error {
	if out, err := nftRun(fmt.Sprintf("delete chain inet %s out\n", b.nftTable)); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	return nil
}

func nftRun(script string) ([]byte, error) {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	return cmd.CombinedOutput()
}

// ---- workers ----

type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func (b *bench) copyProbe() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "shinken-bench-")
	if err != nil {
		return err
	}
	b.probeDir = dir
	os.Chmod(dir, 0o755)
	data, err := os.ReadFile(self)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "probe"), data, 0o755)
}

func (b *bench) worker(s dataplane.Session) (*worker, error) {
	cmd := exec.Command(filepath.Join(b.probeDir, "probe"))
	cmd.Env = []string{probe.EnvVar + "=1"}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := dataplane.StartIn(s, cmd, dataplane.ProcOptions{}); err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	b.mu.Lock()
	b.procs = append(b.procs, w)
	b.mu.Unlock()
	return w, nil
}

func (w *worker) send(line string) error {
	_, err := io.WriteString(w.in, line+"\n")
	return err
}

func (w *worker) recv() (string, error) {
	if !w.out.Scan() {
		return "", fmt.Errorf("worker died: %v", w.out.Err())
	}
	return w.out.Text(), nil
}

func (w *worker) do(line string) string {
	if err := w.send(line); err != nil {
		return "err " + err.Error()
	}
	s, err := w.recv()
	if err != nil {
		return "err " + err.Error()
	}
	return s
}

func (w *worker) stop() {
	w.in.Close()
	done := make(chan struct{})
	go func() { w.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		w.cmd.Process.Kill()
		<-done
	}
}

// ---- servers ----

// server is the accept-and-close server of the connect rounds: one OS thread
// blocked in accept(2) on a blocking socket (not the Go netpoller, whose
// wake-ups land on whichever thread polls), pinned to one CPU when cpu >= 0,
// closing what it accepts.
type server struct {
	fd   int
	addr netip.AddrPort
	done chan struct{}
}

func acceptAndClose(addr netip.AddrPort, cpu int) (*server, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*server, error) {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}); err != nil {
		return fail(err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		return fail(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fail(err)
	}
	srv := &server{fd: fd, addr: netip.AddrPortFrom(addr.Addr(), uint16(sa.(*unix.SockaddrInet4).Port)), done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(srv.done)
		// The thread exits with the goroutine: it is never unlocked.
		runtime.LockOSThread()
		if cpu >= 0 {
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				started <- fmt.Errorf("pin the server to CPU %d: %w", cpu, err)
				return
			}
		}
		started <- nil
		for {
			nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
			switch {
			case err == nil:
				unix.Close(nfd)
			case errors.Is(err, unix.EINTR), errors.Is(err, unix.ECONNABORTED):
			default:
				return // shut down
			}
		}
	}()
	if err := <-started; err != nil {
		<-srv.done
		return fail(err)
	}
	return srv, nil
}

// Close stops the accept thread and closes the socket.
func (s *server) Close() {
	unix.Shutdown(s.fd, unix.SHUT_RDWR) // wakes the blocked accept
	<-s.done
	unix.Close(s.fd)
}

func discard(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return ln, nil
}

// ---- numbers ----

// cpuRate turns "ok COUNT NS CPUNS" into COUNT per CPU-second.
func cpuRate(line string) float64 {
	var n, ns, cpu int64
	if _, err := fmt.Sscanf(line, "ok %d %d %d", &n, &ns, &cpu); err != nil || cpu == 0 {
		return 0
	}
	return float64(n) / (float64(cpu) / 1e9)
}

func fmts(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return out
}

// rate turns "ok COUNT NS" into COUNT per second (0 on error, which the
// output then shows).
func rate(line string) float64 {
	var n, ns int64
	if _, err := fmt.Sscanf(strings.Join(strings.Fields(line)[:min(3, len(strings.Fields(line)))], " "), "ok %d %d", &n, &ns); err != nil || ns == 0 {
		log.Printf("worker: %s", line)
		return 0
	}
	return float64(n) / (float64(ns) / 1e9)
}

// pairs returns a[i]/b[i] for the rounds where both ran (a zero rate is a
// failed round and leaves no pair).
func pairs(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

// medianCI is the distribution-free 95 % confidence interval of the median
// (order statistics; normal approximation of the binomial ranks).
func medianCI(v []float64) (lo, hi float64) {
	n := len(v)
	if n == 0 {
		return 0, 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	d := 1.96 * math.Sqrt(float64(n)) / 2
	j := int(math.Floor(float64(n)/2 - d)) // 1-based rank
	k := int(math.Ceil(float64(n)/2 + d + 1))
	j = max(j, 1)
	k = min(k, n)
	return s[j-1], s[k-1]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mean(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

func numCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "\nprocessor") + 1
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.Index(l, ":"); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return "unknown CPU"
}

func kernelRelease() string {
	data, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(data))
}

// hostSockets counts the TCP and UDP sockets (v4 and v6) the sweep walks.
func hostSockets() int {
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if l := strings.Count(string(b), "\n"); l > 0 {
			n += l - 1
		}
	}
	return n
}
