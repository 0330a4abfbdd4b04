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
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/connrounds"
	"github.com/shinken-agent/shinken/bench/internal/teardown"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/probe"
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
	cleanup := teardown.Add(b.cleanup)
	teardown.OnSignal("")
	defer cleanup()
	if err := b.run(); err != nil {
		cleanup()
		log.Fatal(err)
	}
}

type bench struct {
	dp        *dataplane.Dataplane
	root      string // cgroup2 mount
	tag       string
	baseCg    string
	twinCg    string    // the baseline's twin (A/A floor)
	disp      *dispatch // the dispatch contender (dispatch.go)
	dispLess  *dispatch // -dispatch-less's
	nftParent string
	nftTable  string
	nftChain  string // script that adds the output chain and its rules
	probeDir  string
	mu        sync.Mutex // guards procs, disp and dispLess
	procs     []*connrounds.Worker
}

// cleanup removes what the run made; it runs once, whoever calls it first
// (the run's end or a signal: teardown), and a concurrent caller waits for
// it to finish. It leaves the fields as they are: a run still going on
// another goroutine then fails on a closed dataplane instead of a nil one.
func (b *bench) cleanup() {
	b.mu.Lock()
	procs, disps := b.procs, []*dispatch{b.disp, b.dispLess}
	b.mu.Unlock()
	for _, w := range procs {
		w.Stop()
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
				connrounds.RmCgroup(filepath.Join(b.nftParent, e.Name()))
			}
		}
		connrounds.RmCgroup(b.nftParent)
	}
	connrounds.RmCgroup(b.baseCg)
	connrounds.RmCgroup(b.twinCg)
	for _, d := range disps {
		if d != nil {
			d.close()
			connrounds.RmCgroup(d.cg)
		}
	}
	if b.probeDir != "" {
		os.RemoveAll(b.probeDir)
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
	if b.probeDir, err = connrounds.CopyProbe("shinken-bench-"); err != nil {
		return err
	}

	host, _ := os.Hostname()
	cpu := cpuModel()
	fmt.Printf("machine: %s, %s, %d CPUs, kernel %s\n", host, cpu, benchkit.NumCPU(), benchkit.KernelRelease())
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
	srvCPU := connrounds.ServerCPU(*flagPin)
	connSrv, err := connrounds.AcceptAndClose(netip.MustParseAddrPort("127.0.0.2:0"), srvCPU)
	if err != nil {
		return err
	}
	sink, err := discard("127.0.0.2:0")
	if err != nil {
		return err
	}
	defer connSrv.Close()
	defer sink.Close()
	connAddr := connSrv.Addr
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

	// Baseline: a cgroup with nothing attached, and its twin (the bench's
	// own floor).
	if b.baseCg, b.twinCg, err = connrounds.Baseline(b.root, "shinken-bench", b.tag, !*flagNoTwin); err != nil {
		return err
	}
	if err := b.setupDispatch(); err != nil {
		return err
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
	var wNft *connrounds.Worker
	if !*flagNoNft {
		if wNft, err = b.worker(nftSess); err != nil {
			return err
		}
	}

	// Sanity: the Shinken session is really enforced.
	if got := wShk.Do("tcp 127.0.0.3:" + strconv.Itoa(int(connAddr.Port()))); got != "err EPERM" {
		return fmt.Errorf("bench session is not enforced: %s", got)
	}
	if wNft != nil {
		if err := b.nftOn(); err != nil {
			return err
		}
		got := wNft.Do("tcp 127.0.0.3:" + strconv.Itoa(int(connAddr.Port())))
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
	wTid, err := wAll.TID()
	if err != nil {
		return err
	}
	unpin, err := connrounds.Pin(wTid, srvCPU)
	if err != nil {
		return err
	}
	shkCg, nftCg := bs.Path, nftSess.Path

	// Connect rate, interleaved rounds in rotating order, the figure the
	// median of per-round ratios with a distribution-free 95 % confidence
	// interval (connrounds.Rounds). CPU-normalised rates (connects per
	// CPU-second of the worker, kernel time included) are printed beside
	// them, and the twin's ratio to the baseline is the method's own floor.
	cBase := &connrounds.Contender{Name: "baseline", Cgroup: b.baseCg}
	cShk := &connrounds.Contender{Name: "shinken", Cgroup: shkCg}
	cs := []*connrounds.Contender{cBase, cShk}
	var cTwin, cNft, cDisp, cLess *connrounds.Contender
	if b.twinCg != "" {
		cTwin = &connrounds.Contender{Name: "twin", Cgroup: b.twinCg}
		cs = append(cs, cTwin)
	}
	if b.disp != nil {
		cDisp = &connrounds.Contender{Name: "dispatch", Cgroup: b.disp.cg}
		cs = append(cs, cDisp)
	}
	if b.dispLess != nil {
		cLess = &connrounds.Contender{Name: "dispatch-less", Cgroup: b.dispLess.cg}
		cs = append(cs, cLess)
	}
	if wNft != nil {
		cNft = &connrounds.Contender{Name: "nftables", Cgroup: nftCg, On: b.nftOn, Off: b.nftOff}
		cs = append(cs, cNft)
	}
	if *flagOrder != "" {
		var ordered []*connrounds.Contender
		for _, n := range strings.Split(*flagOrder, ",") {
			for _, c := range cs {
				if c.Name == n {
					ordered = append(ordered, c)
				}
			}
		}
		if len(ordered) != len(cs) {
			return fmt.Errorf("-order %q does not name each contender once", *flagOrder)
		}
		cs = ordered
	}
	rounds := connrounds.Rounds{Worker: wAll, Server: connSrv, Rounds: *flagRounds, Secs: *flagSecs, Settle: *flagSettle}
	if err := rounds.Run(cs); err != nil {
		return err
	}
	connrounds.PrintRates("", *flagRounds, *flagSecs, cs)
	pairBase := connrounds.Compare("", "shinken/baseline", cShk, cBase)
	var pairNft []float64
	if cNft != nil {
		pairNft = connrounds.Compare("", "shinken/nftables", cShk, cNft)
	}
	if cTwin != nil {
		connrounds.Compare("", "twin/baseline (the bench's floor: nothing differs)", cTwin, cBase)
	}
	var pairDisp []float64
	if cDisp != nil {
		pairDisp = connrounds.Compare("", fmt.Sprintf("dispatch/baseline (a program that returns at once at each of the %d cgroup hooks Shinken attaches in %s mode: the floor of shinken/baseline)", len(b.disp.links), b.dp.FlowMode()), cDisp, cBase)
		connrounds.Compare("", "shinken/dispatch (what Shinken's programs cost beyond their dispatch)", cShk, cDisp)
	}
	if cLess != nil {
		connrounds.Compare("", fmt.Sprintf("dispatch-less/baseline (diagnostic: the dispatch contender without %s, %d hooks)", *flagDispatchLess, len(b.dispLess.links)), cLess, cBase)
		connrounds.Compare("", "dispatch/dispatch-less (diagnostic: what those hooks' dispatch costs)", cDisp, cLess)
	}

	// The other phases place their threads themselves, or not at all.
	if err := unpin(); err != nil {
		return err
	}

	// Stream throughput, paired rounds likewise.
	var sBase, sShk, sPair []float64
	stream := fmt.Sprintf("stream %s %g", sinkAddr, *flagStream)
	streamIn := func(cg string) (float64, error) {
		if err := wAll.MoveTo(cg); err != nil {
			return 0, err
		}
		return connrounds.Rate(wAll.Do(stream)), nil
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
		*flagStream, connrounds.Median(sBase)/1e6, connrounds.Median(sShk)/1e6, connrounds.Median(sPair), fmts(sPair))

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
	lat, whole, floor, parts, err := b.revokeLatency()
	if err != nil {
		return err
	}
	sort.Float64s(lat)
	sort.Float64s(whole)
	sort.Float64s(floor)
	fmt.Printf("revoke -> first denied connect, %d revokes: p50 %.1fus  p90 %.1fus  p99 %.1fus  max %.1fus\n",
		len(lat), connrounds.Pct(lat, 50), connrounds.Pct(lat, 90), connrounds.Pct(lat, 99), lat[len(lat)-1])
	if len(floor) > 0 {
		fmt.Printf("  the same with nothing revoked (the floor: a control instant 1.5 ms into each worker loop, to the next connect's return), %d loops: p50 %.1fus  p90 %.1fus  p99 %.1fus  max %.1fus\n",
			len(floor), connrounds.Pct(floor, 50), connrounds.Pct(floor, 90), connrounds.Pct(floor, 99), floor[len(floor)-1])
	}
	printRevokeTail(parts)
	st := b.dp.SweepStats()
	fmt.Printf("Revoke call, whole (map write + cutting open flows, %s mode; %d TCP+UDP sockets on the host): p50 %.1fus  p99 %.1fus; sweeps %d, sockets destroyed %d\n",
		b.dp.FlowMode(), hostSockets(), connrounds.Pct(whole, 50), connrounds.Pct(whole, 99), st.Sweeps, st.Destroyed)
	fmt.Printf("session create, mean of 10: at 10 sessions %.1fus, at %d sessions %.1fus\n", benchkit.Mean(at10), *flagSessions, benchkit.Mean(at10k))

	ratioNft := connrounds.Median(pairNft)
	fmt.Printf("session_create_us_at_10=%.1f\n", benchkit.Mean(at10))
	fmt.Printf("session_create_us_at_10k=%.1f\n", benchkit.Mean(at10k))
	fmt.Printf("seccomp_filter_instructions=%d\n", filterLen)
	fmt.Printf("seccomp_ns_per_syscall=%.1f\n", scDiff)
	fmt.Printf("egress_connect_ratio_vs_baseline=%.3f\n", connrounds.Median(pairBase))
	fmt.Printf("egress_connect_ratio_vs_nftables=%.3f\n", ratioNft)
	if len(pairDisp) > 0 {
		fmt.Printf("egress_connect_ratio_dispatch_floor=%.3f\n", connrounds.Median(pairDisp))
	}
	fmt.Printf("revoke_to_deny_p99_us=%.1f\n", connrounds.Pct(lat, 99))
	if len(floor) > 0 {
		fmt.Printf("revoke_to_deny_floor_p99_us=%.1f\n", connrounds.Pct(floor, 99))
	}
	fmt.Printf("egress_stream_ratio_vs_baseline=%.3f\n", connrounds.Median(sPair))
	return nil
}
