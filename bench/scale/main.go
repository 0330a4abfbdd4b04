//go:build linux

// Command scale is the session-count benchmark (make bench-scale): it runs
// the real shinken-agent daemon on private directories and grows it, one
// session at a time through the API, to -at (10,000) and then to -sessions
// (100,000) live sessions, each with its cgroup and kernel entry (a
// session's holder process and namespaces start at its first launch: the
// run launches into none of them, so they cost none). At both counts it measures, in the same run and by the same
// method:
//
//   - connect()+close() from inside one of the daemon's sessions against
//     the same worker in a cgroup with nothing attached, and in a twin of
//     that cgroup (the method's own floor), as make bench-egress measures
//     it (egress.go);
//   - a /metrics scrape and `shinkenctl -o json session ls`;
//   - the daemon's resident memory, its open files, the holders' Pss and
//     the host's kernel memory;
//   - a restart: the daemon killed with SIGKILL and started again on the
//     same state, pins and cgroups, timed to its API's first answer, then
//     checked (every session listed, s0's grant still enforced) and its
//     resident memory read again once settled (restart.go).
//
// Every creation is timed (session_create_p99_ms over each growth). The
// host's process and namespace ceilings are raised for the run when they
// are below what its one launched session needs, and restored; every cgroup, pin, process
// and directory the run makes is removed at its end, also when it is
// interrupted (SIGINT, SIGTERM, SIGHUP; a second signal kills it).
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/daemon"
	"github.com/shinken-agent/shinken/bench/internal/teardown"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

var (
	flagSessions = flag.Int("sessions", 100000, "live sessions at the end")
	flagAt       = flag.Int("at", 10000, "the first count measured (the companion figures)")
	flagBin      = flag.String("bin", "bin", "directory holding shinken-agent, shinkenctl and the launchers")
	flagRounds   = flag.Int("rounds", 60, "interleaved connect rounds per contender, at each count")
	flagSecs     = flag.Float64("secs", 0.25, "seconds per connect round")
	flagSettle   = flag.Duration("settle", 50*time.Millisecond, "idle pause before every connect round")
	flagPin      = flag.Bool("pin", true, "connect rounds: worker on CPU 0, accept server on CPU 1 (machines with 2+ CPUs)")
	flagScrapes  = flag.Int("scrapes", 5, "timed /metrics scrapes and session listings at each count")
	flagPprof    = flag.String("pprof", "", "directory: start the daemon with -debug-pprof and save, at each count, its heap profile (after a GC) and a CPU profile of -pprof-secs of back-to-back /metrics scrapes taken after the timed ones (off: \"\")")
	flagPprofS   = flag.Int("pprof-secs", 5, "seconds of the CPU profile of scrapes (-pprof)")
	flagReserve  = flag.Int("reserve-mib", 1024, "stop growing when the host's MemAvailable falls below this (the run then measures where it stopped)")
)

func main() {
	boundary.Main() // the launcher's fallback: this binary re-executed
	if os.Getenv(probe.EnvVar) != "" {
		probe.Main()
	}
	flag.Parse()
	log.SetFlags(0)
	if os.Geteuid() != 0 {
		log.Fatal("bench-scale needs root")
	}
	if *flagAt < 1 || *flagSessions < *flagAt {
		log.Fatalf("-at %d and -sessions %d: want 1 <= at <= sessions", *flagAt, *flagSessions)
	}
	b := &bench{}
	cleanup := teardown.Add(b.cleanup)
	teardown.OnSignal(" (a second signal kills the bench and leaves its sessions)")
	err := b.run()
	cleanup()
	if err != nil {
		log.Fatal(err)
	}
}

type bench struct {
	tag, dir      string
	parent, pin   string
	sock, metrics string
	agentBin, ctl string
	maxSessions   int
	agent         *exec.Cmd
	started       bool // a daemon was started: cleanup uninstalls its sessions and pins
	alog          bytes.Buffer
	hc            *http.Client
	eg            *egress // the connect rounds' worker, cgroups and server
	mu            sync.Mutex
	sysctls       []saved
}

// cleanup removes what the run made; it runs once, whoever calls it first
// (the run's end or a signal: teardown).
func (b *bench) cleanup() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.eg != nil {
		b.eg.close()
	}
	if b.agent != nil {
		b.agent.Process.Kill()
		b.agent.Wait()
	}
	if b.started {
		t0 := time.Now()
		out, err := exec.Command(b.agentBin, "-config", "", "-cgroup-parent", b.parent, "-pin-path", b.pin,
			"-max-sessions", strconv.Itoa(b.maxSessions), "-uninstall").CombinedOutput()
		if err != nil {
			log.Printf("uninstall: %v: %s", err, out)
		} else {
			log.Printf("uninstalled the agent's sessions, cgroups and pins in %v", time.Since(t0).Round(time.Millisecond))
		}
	}
	restoreSysctls(b.sysctls)
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

func (b *bench) run() error {
	tb := make([]byte, 3)
	rand.Read(tb)
	b.tag = hex.EncodeToString(tb)
	var err error
	if b.dir, err = os.MkdirTemp("", "shinken-bench-scale-"); err != nil {
		return err
	}
	b.parent, b.pin = "shinken-bench-scale-"+b.tag, "/sys/fs/bpf/shinken-bench-scale-"+b.tag
	b.sock = filepath.Join(b.dir, "agent.sock")
	b.agentBin, b.ctl = filepath.Join(*flagBin, "shinken-agent"), filepath.Join(*flagBin, "shinkenctl")
	// Room for the sessions and the bench's own: the agent's tables hold
	// max-sessions-1 sessions (index 0 is never one).
	b.maxSessions = *flagSessions + 64

	host, _ := os.Hostname()
	fmt.Printf("machine: %s, %d CPUs, kernel %s, load average %s, MemAvailable %.0f MiB\n", host, benchkit.NumCPU(), benchkit.KernelRelease(), benchkit.LoadAvg(), benchkit.MemInfoMiB("MemAvailable:"))
	b.mu.Lock()
	b.sysctls, err = raiseSysctls()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if err := b.startAgent(); err != nil {
		return err
	}
	eg, err := newEgress(b)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.eg = eg
	b.mu.Unlock()

	kern0 := benchkit.KernelMiB()
	first, n, err := b.grow(0, *flagAt)
	if err != nil {
		return err
	}
	at := b.measure(n, first, kern0)
	if at.err != nil {
		return at.err
	}
	if at.restart, err = b.restart(n); err != nil {
		return err
	}
	var end result
	if *flagSessions > *flagAt && growthStop == "" {
		growth, n, err := b.grow(n, *flagSessions)
		if err != nil {
			return err
		}
		end = b.measure(n, growth, kern0)
		if end.err != nil {
			return end.err
		}
		if end.restart, err = b.restart(n); err != nil {
			return err
		}
	}
	at.print()
	if end.n > 0 {
		end.print()
		fmt.Printf("egress_connect_ratio_delta_%s_vs_%s=%.3f\n", label(end.n), label(at.n), end.ratio-at.ratio)
	}
	if growthStop != "" {
		return fmt.Errorf("the run stopped growing at %d sessions (of %d asked): %s", max(at.n, end.n), *flagSessions, growthStop)
	}
	return nil
}

// startAgent starts the daemon on the bench's private directories with its
// tables sized for the run, and waits for its API.
func (b *bench) startAgent() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	b.metrics = ln.Addr().String()
	ln.Close()
	os.MkdirAll(filepath.Join(b.dir, "manifests"), 0o755)
	os.WriteFile(filepath.Join(b.dir, "manifests", "bench.manifest"), []byte("image bench\nallow net.egress cidrs=127.0.0.0/8\n"), 0o644)
	if err := b.launchAgent(); err != nil {
		return err
	}
	b.hc = &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", b.sock) }, MaxIdleConnsPerHost: 4}}
	if daemon.WaitAPI(b.hc, 1200) {
		return nil
	}
	return fmt.Errorf("agent did not start:\n%s", b.alog.String())
}

// launchAgent starts the daemon process on the bench's directories (the
// first start and a restart alike).
func (b *bench) launchAgent() error {
	cmd := daemon.Command(b.agentBin, "-config", "", "-state-dir", filepath.Join(b.dir, "state"), "-socket", b.sock,
		"-metrics-addr", b.metrics, "-policy-dir", filepath.Join(b.dir, "policy"), "-manifest-dir", filepath.Join(b.dir, "manifests"),
		"-cgroup-parent", b.parent, "-pin-path", b.pin, "-max-sessions", strconv.Itoa(b.maxSessions),
		"-dns-listen", "0.0.0.0:0", "-dns-upstreams", "127.0.0.1:9")
	if *flagPprof != "" {
		cmd.Args = append(cmd.Args, "-debug-pprof")
	}
	cmd.Stdout, cmd.Stderr = &b.alog, &b.alog
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	b.agent, b.started = cmd, true
	return nil
}

// growthStop says why the last growth stopped short of its target ("" if
// it did not).
var growthStop string

// grow creates sessions s<from>..s<to-1> one at a time, each timed (ms),
// and returns the times and the live count reached. It stops early, without
// an error, when the host's MemAvailable falls below -reserve-mib: the run
// then measures the count it reached.
func (b *bench) grow(from, to int) ([]float64, int, error) {
	if growthStop != "" {
		return nil, from, nil
	}
	t0 := time.Now()
	times := make([]float64, 0, to-from)
	for i := from; i < to; i++ {
		if i%1000 == 0 {
			if avail := benchkit.MemInfoMiB("MemAvailable:"); avail < float64(*flagReserve) {
				growthStop = fmt.Sprintf("MemAvailable %.0f MiB, below -reserve-mib %d", avail, *flagReserve)
				break
			}
			if i > from && i%10000 == 0 {
				fmt.Printf("  %d sessions, %v, MemAvailable %.0f MiB\n", i, time.Since(t0).Round(time.Second), benchkit.MemInfoMiB("MemAvailable:"))
			}
		}
		t := time.Now()
		if err := daemon.CreateSession(b.hc, i); err != nil {
			return nil, 0, fmt.Errorf("at %d live sessions: %w", i, err)
		}
		times = append(times, float64(time.Since(t).Nanoseconds())/1e6)
	}
	fmt.Printf("grew from %d to %d sessions through the API, one at a time, in %v\n", from, from+len(times), time.Since(t0).Round(time.Millisecond))
	return times, from + len(times), nil
}

// label names a count in the figures' names: 10000 is 10k, 2500 is 2500.
func label(n int) string {
	if n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}
