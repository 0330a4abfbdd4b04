//go:build linux

// Command neighbor is the fair-sharing benchmark (make bench-neighbor,
// issue 23). It starts the real shinken-agent on private directories, with
// a DNS upstream of its own on loopback (the machine has no network), and
// makes two sessions through the API: A, the flooder, and B, the
// neighbour. Both hold a domain grant (**.neighbor.test, 127.64.0.0/10,
// port 443); A's image also escalates egress denials inside 10.0.0.0/8.
//
// Phases, in one run: idle (A does nothing), then each flood in turn with
// an idle phase after it. A flood is this binary started in A through the
// API (POST .../processes): DNS queries, big answers, denials to distinct
// destinations, socket and port churn, a fork bomb, a tmpfs fill (flood.go).
// It runs for -ramp, then B is measured for -window, then it stops (the
// bench kills its process tree). In every phase, B measures the same way:
//
//   - DNS: the probe (probe.go), started in B through the API, sends -rate
//     queries a second for -window to port 53 (the resolver), every
//     -fresh-every-th a name never asked (upstream + kernel write), the
//     others one cached name; each timed from its send to its reply, lost
//     past 1 s;
//   - grants: the bench asks for a net.egress /32 grant for B through the
//     API one at a time, every -grant-every, timed from the request's first
//     byte to the answer's last, and revokes it (untimed); then it sends
//     the same request to the grant floor (package grantfloor: a bare
//     server in a process of its own, at the agent's CPU weight, that
//     writes and syncs a grant's records as the agent does, no agent
//     code), timed the same way: the control beside B's grants, as B's
//     UDP echo is beside its DNS.
//
// Throughout, the bench samples the agent's resident memory and the host's
// free ephemeral ports every 250 ms, and reads what the audit log gained
// for session A.
//
// The figures: each flood's B DNS p99 and grant p99 over those of the idle
// phases pooled (same run), the worst flood printed as the headline; B's
// lost or failed queries during floods over those sent; the audit bytes A's
// records took per minute of flood (the worst flood); the agent's peak RSS
// in the floods over its RSS at the end of the first idle phase; the fewest
// free ephemeral ports seen (TCP or UDP, whichever is fewer).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/daemon"
	"github.com/shinken-agent/shinken/bench/internal/grantfloor"
	"github.com/shinken-agent/shinken/bench/internal/teardown"
	"github.com/shinken-agent/shinken/dataplane"
)

var (
	flagBin        = flag.String("bin", "bin", "directory holding shinken-agent (and its launchers)")
	flagSliceUS    = flag.Int("agent-slice-us", 0, "the daemon's -cpu-slice-us (0: its default, 100; -1: the kernel's default slice), for an A/B of the agent's CPU slice")
	flagFloods     = flag.String("floods", "cpu,dns,big,deny,sockets,forkbomb,tmpfs", "floods to run, in order; cpu (busy loops only) is the control, left out of the headline figures")
	flagRamp       = flag.Duration("ramp", 2*time.Second, "a flood's run before B is measured")
	flagWindow     = flag.Duration("window", 10*time.Second, "B's measurement in each phase")
	flagRate       = flag.Int("rate", 200, "B's DNS queries per second")
	flagFreshEvery = flag.Int("fresh-every", 5, "every Nth of B's queries is a name never asked")
	flagGrantEvery = flag.Duration("grant-every", 20*time.Millisecond, "B's grants: one started every")
	flagGrantFloor = flag.Bool("grant-floor", true, "time the grant floor (package grantfloor) after each of B's grants, the control beside them")
	flagFloorServe = flag.String("grant-floor-serve", "", "internal: serve the grant floor on this unix socket, its files beside it")
	flagFloorAudit = flag.Int("grant-floor-audit-bytes", 336, "internal: the grant floor's audit record size")
	flagFloorJourn = flag.Int("grant-floor-journal-bytes", 275, "internal: the grant floor's journal line size")
	flagFloodNice  = flag.Int("flood-nice", 19, "A's flood processes run under nice -n N (0: not niced, as a hostile session would run, but the fork bomb's Go flood process then dies at the bound, see bench/README; 19 stands in for a CPU share this host cannot bound)")
)

func main() {
	if os.Getenv(upstreamEnv) != "" {
		upstreamMain()
	}
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		workerMain()
	}
	flag.Parse()
	log.SetFlags(0)
	if *flagFloorServe != "" {
		log.Fatal(serveFloor(*flagFloorServe))
	}
	if os.Geteuid() != 0 {
		log.Fatal("bench-neighbor needs root")
	}
	// Cleanups (teardown) run once, the last registered first: at the end
	// of run, or on a signal (the agent is stopped and uninstalled, which
	// kills the sessions' processes; a flood's own deadline_s bounds it
	// besides).
	teardown.OnSignal("")
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// workerMain: "worker probe SECONDS RATE FRESHEVERY TAG" (in B) or
// "worker flood MODE SECONDS" (in A).
func workerMain() {
	a := os.Args[2:]
	var err error
	switch {
	case len(a) == 5 && a[0] == "probe":
		err = probe(seconds(a[1]), benchkit.WorkerCount(a[2]), benchkit.WorkerCount(a[3]), a[4])
	case len(a) == 3 && a[0] == "flood":
		err = flood(a[1], seconds(a[2]))
	default:
		err = fmt.Errorf("worker: bad arguments %q", a)
	}
	benchkit.WorkerExit(err)
}

func seconds(s string) time.Duration {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		fmt.Fprintf(os.Stderr, "worker: bad seconds %q\n", s)
		os.Exit(2)
	}
	return time.Duration(f * float64(time.Second))
}

const manifest = `image neighbor
allow net.egress domains=**.neighbor.test cidrs=127.64.0.0/10 ports=443
allow net.egress cidrs=127.1.0.0/16 ports=443
image flood
allow net.egress domains=**.neighbor.test cidrs=127.64.0.0/10 ports=443
allow net.egress cidrs=10.0.0.0/8 tier=ask
escalate net.egress
`

type bench struct {
	c        *client
	metrics  string // the agent's /metrics address
	exe      string
	smp      *sampler
	auditLog string
	grantSeq int
	floor    *grantfloor.Floor // nil: -grant-floor=false
}

func run() error {
	// The worker must be readable in the sessions (the host's root is
	// their read-only view): not under /tmp, which is each session's own.
	dir, err := os.MkdirTemp("/var/tmp", "shinken-bench-neighbor-")
	if err != nil {
		return err
	}
	defer teardown.Add(func() { os.RemoveAll(dir) })()
	os.Chmod(dir, 0o755)
	tag := filepath.Base(dir)[len("shinken-bench-neighbor-"):]
	priv, err := os.MkdirTemp("", "shinken-bench-neighbor-agent-")
	if err != nil {
		return err
	}
	defer teardown.Add(func() { os.RemoveAll(priv) })()
	b := &bench{exe: filepath.Join(dir, "worker"), auditLog: filepath.Join(priv, "state", audit.LogFile)}
	data, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return err
	}
	if err := os.WriteFile(b.exe, data, 0o755); err != nil {
		return err
	}
	up, err := benchkit.StartChild(upstreamEnv)
	if err != nil {
		return err
	}
	defer teardown.Add(func() { up.Stop() })()

	parent, pin := "shinken-bench-neighbor-"+tag, "/sys/fs/bpf/shinken-bench-neighbor-"+tag
	sock := filepath.Join(priv, "agent.sock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	os.MkdirAll(filepath.Join(priv, "manifests"), 0o755)
	if err := os.WriteFile(filepath.Join(priv, "manifests", "neighbor.manifest"), []byte(manifest), 0o644); err != nil {
		return err
	}
	agentBin := filepath.Join(*flagBin, "shinken-agent")
	cmd := daemon.Command(agentBin, "-config", "", "-state-dir", filepath.Join(priv, "state"), "-socket", sock,
		"-metrics-addr", metricsAddr, "-policy-dir", filepath.Join(priv, "policy"), "-manifest-dir", filepath.Join(priv, "manifests"),
		"-cgroup-parent", parent, "-pin-path", pin, "-dns-listen", "0.0.0.0:0", "-dns-upstreams", up.Addr.String(), "-cpu-slice-us", fmt.Sprint(*flagSliceUS))
	alog, err := os.Create(filepath.Join(priv, "agent.log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = alog, alog
	if err := cmd.Start(); err != nil {
		return err
	}
	defer teardown.Add(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if out, err := exec.Command(agentBin, "-cgroup-parent", parent, "-pin-path", pin, "-uninstall").CombinedOutput(); err != nil {
			log.Printf("uninstall: %v: %s", err, out)
		}
	})()
	b.metrics = metricsAddr
	b.c = &client{hc: &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}}
	if err := b.waitUp(); err != nil {
		data, _ := os.ReadFile(alog.Name())
		return fmt.Errorf("%v:\n%s", err, data)
	}
	aUID, err := b.setup()
	if err != nil {
		return err
	}
	if *flagGrantFloor {
		if b.floor, err = startFloor(filepath.Join(priv, "floor"), filepath.Join(priv, "state"), cmd.Process.Pid); err != nil {
			return err
		}
		defer teardown.Add(b.floor.Stop)()
	}
	host, _ := os.Hostname()
	fmt.Printf("machine: %s, %d CPUs, kernel %s, load average %s\n", host, numCPU(), benchkit.KernelRelease(), benchkit.LoadAvg())
	fmt.Printf("agent: %s (its own session, as a service manager starts it)\n", daemon.Autogroup(cmd.Process.Pid))
	lo, hi := portRange()
	fmt.Printf("load: B probes DNS at %d queries/s (every %dth a new name), 1 s timeout, and asks for a grant every %v, for %v in each phase; each flood runs %v before B's window and to its end, under nice %d; host ephemeral range %d-%d (%d ports)\n",
		*flagRate, *flagFreshEvery, *flagGrantEvery, *flagWindow, *flagRamp, *flagFloodNice, lo, hi, hi-lo+1)
	b.smp = startSampler(cmd.Process.Pid, aUID, 250*time.Millisecond)
	defer b.smp.close()
	phases, err := b.phases(strings.Split(*flagFloods, ","))
	if err != nil {
		return err
	}
	report(phases)
	fmt.Printf("upstream queries answered: %d; load average at the end %s\n", up.Stop(), benchkit.LoadAvg())
	return nil
}

func (b *bench) waitUp() error {
	// Up to 60 s: on a loaded 2-CPU host the agent's start (its BPF
	// programs through the verifier) has taken more than 10.
	for i := 0; i < 1200; i++ {
		if code, _, _, err := b.c.call("GET", "/v1/status", nil, nil); err == nil && code == http.StatusOK {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the agent did not answer within 60 s")
}

// setup creates A and B and gives each its domain grant; it prints the
// boundary rows that bound the floods.
func (b *bench) setup() (aUID uint32, err error) {
	for _, s := range []capability.SessionSpec{{ID: "A", Image: "flood"}, {ID: "B", Image: "neighbor"}} {
		if code, msg, _, err := b.c.call("POST", "/v1/sessions", s, nil); err != nil || code/100 != 2 {
			return 0, fmt.Errorf("create session %s: HTTP %d %v: %s", s.ID, code, err, msg)
		}
		dom := capability.Capability{Class: capability.ClassNetEgress, Egress: &capability.EgressScope{
			Domains: []string{"**.neighbor.test"}, CIDRs: []netip.Prefix{netip.MustParsePrefix("127.64.0.0/10")},
			Ports: []capability.PortRange{{Lo: 443, Hi: 443}}}}
		if _, _, err := b.c.request(s.ID, dom); err != nil {
			return 0, err
		}
		var v wire.SessionView
		if _, _, _, err := b.c.call("GET", "/v1/sessions/"+s.ID, nil, &v); err == nil && v.UID != nil {
			fmt.Printf("session %s: image %s, uid %d, index %d\n", s.ID, s.Image, *v.UID, v.Index)
			if s.ID == "A" {
				aUID = *v.UID
			}
		}
	}
	var st any
	seen := map[string]bool{}
	if _, _, _, err := b.c.call("GET", "/v1/status", nil, &st); err == nil {
		walkRows(st, func(row map[string]any) {
			for _, k := range []string{"mechanism", "name", "class"} {
				if n, ok := row[k].(string); ok {
					l := strings.ToLower(n)
					for _, w := range []string{"sockets", "ports", "session process limit", "session tmpfs size", "pids"} {
						if l == w && !seen[w] {
							seen[w] = true
							j, _ := json.Marshal(row)
							fmt.Printf("status: %s\n", j)
							return
						}
					}
				}
			}
		})
	}
	var v wire.SessionView
	if _, _, _, err := b.c.call("GET", "/v1/sessions/A", nil, &v); err == nil {
		path := v.Path
		if !filepath.IsAbs(path) {
			if root, err := dataplane.FindCgroup2Mount(); err == nil {
				path = filepath.Join(root, path)
			}
		}
		if data, err := os.ReadFile(filepath.Join(path, "pids.max")); err == nil {
			fmt.Printf("session A's pids.max: %s\n", strings.TrimSpace(string(data)))
		} else {
			fmt.Printf("session A's pids.max: none (%v): RLIMIT_NPROC alone bounds the fork bomb\n", err)
		}
	}
	if aUID == 0 {
		return 0, fmt.Errorf("session A's uid: not in its view")
	}
	return aUID, nil
}

// walkRows calls f for every JSON object inside v.
func walkRows(v any, f func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		f(x)
		for _, y := range x {
			walkRows(y, f)
		}
	case []any:
		for _, y := range x {
			walkRows(y, f)
		}
	}
}

// phase is what one phase measured.
type phase struct {
	name       string // "idle" or the flood's
	probe      map[string][]float64
	probeErr   string    // why B's probe did not run, if it did not (its queries all count lost)
	grants     []float64 // ms
	floors     []float64 // the grant floor's, ms (the control)
	host       hostFigures
	floodOut   string
	floodDur   time.Duration
	auditOwn   int64 // bytes of A's audit records, the flood and 2 s after it
	auditAll   int64
	auditTypes map[string][2]int64 // A's records: bytes and count per event name
	loadAfter  string
	heap       string // the agent's Go heap and goroutines at the phase's end
}

func (b *bench) phases(floods []string) ([]*phase, error) {
	var out []*phase
	p, err := b.idle(0)
	if err != nil {
		return nil, err
	}
	out = append(out, p)
	for i, f := range floods {
		p, err := b.flood(f)
		if err != nil {
			return nil, fmt.Errorf("flood %s: %w", f, err)
		}
		out = append(out, p)
		p, err = b.idle(i + 1)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func (b *bench) idle(i int) (*phase, error) {
	p := &phase{name: "idle"}
	t0 := time.Now()
	if err := b.measure(p, fmt.Sprintf("i%d", i)); err != nil {
		return nil, err
	}
	p.host = summarize(b.smp.window(t0, time.Now()))
	p.loadAfter = benchkit.LoadAvg()
	p.heap = b.heap()
	return p, nil
}

func (b *bench) flood(mode string) (*phase, error) {
	p := &phase{name: mode}
	_, _, off, err := auditSince(b.auditLog, 0, "A", nil)
	if err != nil {
		return nil, err
	}
	dur := *flagRamp + *flagWindow + 2*time.Second // to past B's last reply
	t0 := time.Now()
	argv := []string{b.exe, "worker", "flood", mode, fmt.Sprintf("%.3f", dur.Seconds())}
	if *flagFloodNice != 0 {
		argv = append([]string{"/usr/bin/nice", "-n", strconv.Itoa(*flagFloodNice)}, argv...)
	}
	id, err := b.c.start("A", dur+30*time.Second, argv...)
	if err != nil {
		return nil, err
	}
	time.Sleep(*flagRamp)
	merr := b.measure(p, mode)
	out, ferr := b.c.finish("A", id, time.Until(t0.Add(dur+10*time.Second)))
	p.floodDur = time.Since(t0)
	p.floodOut = out
	if merr != nil {
		return nil, merr
	}
	if ferr != nil {
		return nil, ferr
	}
	p.host = summarize(b.smp.window(t0, time.Now()))
	time.Sleep(2 * time.Second) // the last second's denial records
	p.auditTypes = map[string][2]int64{}
	if p.auditOwn, p.auditAll, _, err = auditSince(b.auditLog, off, "A", p.auditTypes); err != nil {
		return nil, err
	}
	p.loadAfter = benchkit.LoadAvg()
	p.heap = b.heap()
	return p, nil
}

// heap reads the agent's Go heap figures, ring drops, goroutines and
// kernel denials from its /metrics.
func (b *bench) heap() string {
	m, err := daemon.Metrics(b.metrics)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%s, ring drops %.0f, goroutines %.0f, kernel denials %.0f",
		daemon.HeapMiB(m, "heap_inuse", "heap_sys", "heap_released"),
		m["shinken_ringbuf_drops_total"], m["go_goroutines"], m["shinken_denials_total"])
}

// measure runs B's probe and B's grants side by side for one window.
func (b *bench) measure(p *phase, tag string) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var gerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := time.Now()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b.grantSeq++
			n := b.grantSeq
			addr := netip.AddrFrom4([4]byte{127, 1, byte(n >> 8), byte(n)})
			h, took, err := b.c.grantOne("B", addr)
			if err != nil {
				gerr = err
				return
			}
			p.grants = append(p.grants, float64(took.Nanoseconds())/1e6)
			if err := b.c.revoke(h); err != nil {
				gerr = err
				return
			}
			if b.floor != nil {
				_, took, err := (&client{hc: b.floor.HC}).grantOne("B", addr)
				if err != nil {
					gerr = fmt.Errorf("grant floor: %w", err)
					return
				}
				p.floors = append(p.floors, float64(took.Nanoseconds())/1e6)
			}
			next = next.Add(*flagGrantEvery)
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			} else {
				next = time.Now()
			}
		}
	}()
	out, err := b.c.run("B", *flagWindow+30*time.Second, b.exe, "worker", "probe",
		fmt.Sprintf("%.3f", flagWindow.Seconds()), strconv.Itoa(*flagRate), strconv.Itoa(*flagFreshEvery), tag)
	close(stop)
	wg.Wait()
	if gerr != nil {
		return fmt.Errorf("B's grants: %w", gerr)
	}
	var nr *notRunError
	if errors.As(err, &nr) {
		// B could not run its probe in this window (seen in the fork
		// bomb: the process's shim did not start within the agent's
		// 10 s): every query B meant to send counts as lost, and the
		// run goes on to the next phase.
		sent := float64(*flagRate) * flagWindow.Seconds()
		p.probe = map[string][]float64{"sent": {sent}, "lost_cached": {sent}}
		p.probeErr = err.Error()
		return nil
	}
	if err != nil {
		return fmt.Errorf("B's probe: %w", err)
	}
	p.probe, err = benchkit.ParseLines(out)
	return err
}
