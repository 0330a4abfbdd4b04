//go:build linux

// Command agent is the daemon scale benchmark (make bench-agent): it starts
// the real shinken-agent binary on private directories, creates N live
// sessions through the API (each holder starts at its first launch), times the
// last creations one at a time (session_create_p99_ms), times /metrics
// scrapes and session listings (`shinkenctl -o json session ls`), reads the
// daemon's resident memory, times net.egress grants through the API one at
// a time (grant_p99_ms, grant.go), and times a launch of /bin/true through the
// session launcher against a plain spawn (run_spawn_overhead_ratio). It
// removes everything it made.
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/daemon"
	"github.com/shinken-agent/shinken/bench/internal/teardown"
)

var (
	flagSessions = flag.Int("sessions", 10000, "live sessions")
	flagBin      = flag.String("bin", "bin", "directory holding shinken-agent and shinkenctl")
	flagSliceUS  = flag.Int("agent-slice-us", 0, "the daemon's -cpu-slice-us (0: its default, 100; -1: the kernel's default slice), for an A/B of the agent's CPU slice")
	flagRounds   = flag.Int("rounds", 5, "timed scrapes and listings")
	flagWorkers  = flag.Int("workers", 4, "concurrent session creations")
	flagTimed    = flag.Int("timed", 500, "the last sessions are created one at a time and timed (at most half of -sessions)")
	flagSpawns   = flag.Int("spawns", 200, "timed launches of /bin/true, and as many plain spawns, interleaved")
	flagGrants   = flag.Int("grants", 500, "timed net.egress grants through the API, one at a time, each to another session (0: none)")
)

func main() {
	flag.Parse()
	log.SetFlags(0)
	if *flagFloorServe != "" {
		log.Fatal(serveFloor(*flagFloorServe)) // the floor's child (floor.go)
	}
	if os.Geteuid() != 0 {
		log.Fatal("bench-agent needs root")
	}
	teardown.OnSignal("")
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	b := make([]byte, 3)
	rand.Read(b)
	tag := hex.EncodeToString(b)
	dir, err := os.MkdirTemp("", "shinken-bench-agent-")
	if err != nil {
		return err
	}
	defer teardown.Add(func() { os.RemoveAll(dir) })()
	parent, pin := "shinken-bench-agent-"+tag, "/sys/fs/bpf/shinken-bench-agent-"+tag
	sock := filepath.Join(dir, "agent.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	metricsAddr := ln.Addr().String()
	ln.Close()
	agentBin := filepath.Join(*flagBin, "shinken-agent")
	ctl := filepath.Join(*flagBin, "shinkenctl")
	os.MkdirAll(filepath.Join(dir, "manifests"), 0o755)
	os.WriteFile(filepath.Join(dir, "manifests", "bench.manifest"), []byte("image bench\nallow net.egress cidrs=127.0.0.0/8\n"), 0o644)
	cmd := daemon.Command(agentBin, "-config", "", "-state-dir", filepath.Join(dir, "state"), "-socket", sock,
		"-metrics-addr", metricsAddr, "-policy-dir", filepath.Join(dir, "policy"), "-manifest-dir", filepath.Join(dir, "manifests"),
		"-cgroup-parent", parent, "-pin-path", pin, "-dns-listen", "0.0.0.0:0", "-dns-upstreams", "127.0.0.1:9", "-cpu-slice-us", fmt.Sprint(*flagSliceUS))
	var alog bytes.Buffer
	cmd.Stdout, cmd.Stderr = &alog, &alog
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
	hc := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }, MaxIdleConnsPerHost: 16}}
	if !daemon.WaitAPI(hc, 1200) {
		return fmt.Errorf("agent did not start:\n%s", alog.String())
	}

	host, _ := os.Hostname()
	fmt.Printf("machine: %s, %d CPUs, kernel %s, load average %s\n", host, benchkit.NumCPU(), benchkit.KernelRelease(), benchkit.LoadAvg())
	fmt.Printf("agent: %s (its own session, as a service manager starts it)\n", daemon.Autogroup(cmd.Process.Pid))
	if err := preflight(*flagSessions); err != nil {
		return err
	}
	kernBefore := benchkit.KernelMiB()
	timed := min(*flagTimed, *flagSessions/2)
	start := time.Now()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for w := 0; w < *flagWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := daemon.CreateSession(hc, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < *flagSessions-timed; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	fill := time.Since(start)
	var creates []float64
	for i := *flagSessions - timed; i < *flagSessions; i++ {
		t0 := time.Now()
		if err := daemon.CreateSession(hc, i); err != nil {
			return err
		}
		creates = append(creates, float64(time.Since(t0).Microseconds())/1e3)
	}
	fmt.Printf("created %d sessions through the API in %v (%d with 4 clients in %v, then %d one at a time)\n", *flagSessions,
		time.Since(start).Round(time.Millisecond), *flagSessions-timed, fill.Round(time.Millisecond), timed)
	fmt.Printf("session create (cgroup, kernel entries, records; no holder until its first launch), one at a time at %d-%d live sessions: median %.2f ms, p99 %.2f ms, max %.2f ms over %d\n",
		*flagSessions-timed, *flagSessions, median(creates), quantile(creates, 0.99), maxOf(creates), len(creates))
	kern := benchkit.KernelMiB() - kernBefore
	pss, holders := daemon.HoldersPssMiB(parent)
	fmt.Printf("memory: %d holders, Pss %.1f MiB in all; kernel slab+stacks+page tables grew by %.0f MiB (%.0f KiB per session; the whole host's, so noisy beside other work); processes on the host %d (pid_max %s)\n",
		holders, pss, kern, kern*1024/float64(*flagSessions), benchkit.CountProcs(), benchkit.ReadTrim("/proc/sys/kernel/pid_max"))

	var scrapes, lists []float64
	var scrapeBytes, listed int
	for r := 0; r < *flagRounds; r++ {
		t0 := time.Now()
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return err
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		scrapes = append(scrapes, float64(time.Since(t0).Microseconds())/1e3)
		scrapeBytes = int(n)

		t0 = time.Now()
		out, err := exec.Command(ctl, "-socket", sock, "-o", "json", "session", "ls").Output()
		if err != nil {
			return fmt.Errorf("session ls: %v", err)
		}
		lists = append(lists, float64(time.Since(t0).Microseconds())/1e3)
		var ss []json.RawMessage
		if err := json.Unmarshal(out, &ss); err != nil {
			return err
		}
		listed = len(ss)
	}
	if listed != *flagSessions {
		return fmt.Errorf("session ls listed %d sessions, want %d", listed, *flagSessions)
	}
	rss := rssMiB(cmd.Process.Pid)
	var grants, floors, revokes []float64
	var fl *floor
	if *flagFloor && (*flagGrants > 0 || *flagExec > 0) {
		if fl, err = startFloor(filepath.Join(dir, "floor"), filepath.Join(dir, "state"), cmd.Process.Pid); err != nil {
			return err
		}
		defer teardown.Add(fl.stop)()
	}
	if *flagGrants > 0 {
		if grants, floors, revokes, err = timeGrants(hc, *flagSessions, *flagGrants, fl); err != nil {
			return err
		}
	}
	apiRun, err := timeAPIRun(hc)
	if err != nil {
		return err
	}
	launch, plain, launcher, err := timeLaunch(*flagBin, uint32(*flagSessions+1000), *flagSpawns)
	if err != nil {
		return err
	}
	fmt.Printf("/metrics scrape (%d bytes): median %.1f ms, max %.1f ms over %d rounds\n", scrapeBytes, median(scrapes), maxOf(scrapes), len(scrapes))
	fmt.Printf("session ls (%d sessions, shinkenctl -o json): median %.1f ms, max %.1f ms\n", listed, median(lists), maxOf(lists))
	fmt.Printf("session_ls_ms_at_10k_sessions=%.1f\n", median(lists))
	fmt.Printf("scrape_ms_at_10k_sessions=%.1f\n", median(scrapes))
	fmt.Printf("agent_rss_mib_at_10k_sessions=%.1f\n", rss)
	fmt.Printf("launcher: %s\n", launcher)
	fmt.Printf("run /bin/true through the API (POST /v1/sessions/s0/run: HTTP, audit record with its fsync, launcher, wait): median %.2f ms over %d\n", median(apiRun), len(apiRun))
	fmt.Printf("launch /bin/true in a session through the launcher (own run cgroup, wait): median %.3f ms, p99 %.3f ms; plain spawn (no session): median %.3f ms, p99 %.3f ms; %d each, interleaved\n",
		median(launch), quantile(launch, 0.99), median(plain), quantile(plain, 0.99), len(launch))
	if len(grants) > 0 {
		fmt.Printf("grant (POST /v1/requests, net.egress one /32 port 443, Auto tier) one at a time at %d live sessions: median %.2f ms, p99 %.2f ms, max %.2f ms over %d (revoked afterwards)\n",
			*flagSessions, median(grants), quantile(grants, 0.99), maxOf(grants), len(grants))
	}
	fmt.Printf("session_create_p99_ms=%.2f\n", quantile(creates, 0.99))
	if len(grants) > 0 {
		fmt.Printf("grant_p99_ms=%.2f\n", quantile(grants, 0.99))
	}
	if len(revokes) > 0 {
		fmt.Printf("revoke (POST /v1/grants/revoke of those grants by handle, one at a time, each grant's rule never used by a connect, so no walk of the host's sockets follows (flow marks): the handle write, the grant's records and their syncs): median %.2f ms, p99 %.2f ms, max %.2f ms over %d\n",
			median(revokes), quantile(revokes, 0.99), maxOf(revokes), len(revokes))
		fmt.Printf("revoke_p99_ms=%.2f\n", quantile(revokes, 0.99))
	}
	if len(floors) > 0 {
		fmt.Printf("grant floor (the same request to a bare net/http server in another process that writes and syncs a grant's records as the agent does, no agent code; one after each grant): median %.2f ms, p99 %.2f ms, max %.2f ms over %d\n",
			median(floors), quantile(floors, 0.99), maxOf(floors), len(floors))
		fmt.Printf("grant_floor_p99_ms=%.2f\n", quantile(floors, 0.99))
	}
	fmt.Printf("run_spawn_overhead_ratio=%.2f\n", median(launch)/median(plain))
	return runtimeFigures(hc, cmd.Process.Pid, filepath.Join(dir, "state"), fl)
}

// runtimeFigures prints the session runtime's figures (procs.go).
func runtimeFigures(hc *http.Client, agentPid int, stateDir string, fl *floor) error {
	if *flagExec > 0 {
		// First into sessions no process entered yet (but s0, by the API
		// run above): each start also starts the session's holder and lays
		// out its view (lazy holder start); then the same sessions again,
		// holders running.
		sa, how, part := false, "GET .../exec: start and attach in one request, first stdout byte", "the upgrade's answer"
		switch *flagExecVia {
		case "exec":
		case "start-attach":
			sa, how, part = true, "POST .../processes, then attach, first stdout byte", "the POST's answer"
		default:
			return fmt.Errorf("-exec-via %q: exec or start-attach", *flagExecVia)
		}
		fb, starts, err := timeExecFirstByte(hc, *flagSessions, *flagExec, sa)
		if err != nil {
			return err
		}
		wfb, wstarts, err := timeExecFirstByte(hc, *flagSessions, *flagExec, sa)
		if err != nil {
			return err
		}
		fmt.Printf("exec of echo (%s) one at a time over %d sessions, each session's first (its holder started by it): median %.2f ms, p99 %.2f ms, max %.2f ms over %d (%s alone: median %.2f ms, p99 %.2f ms)\n",
			how, min(*flagSessions, *flagExec), median(fb), quantile(fb, 0.99), maxOf(fb), len(fb), part, median(starts), quantile(starts, 0.99))
		fmt.Printf("the same in the same sessions again (holders running): median %.2f ms, p99 %.2f ms, max %.2f ms over %d (%s alone: median %.2f ms, p99 %.2f ms)\n",
			median(wfb), quantile(wfb, 0.99), maxOf(wfb), len(wfb), part, median(wstarts), quantile(wstarts, 0.99))
		fmt.Printf("exec_first_byte_p99_ms=%.2f\nexec_first_byte_held_p99_ms=%.2f\n", quantile(fb, 0.99), quantile(wfb, 0.99))
		if fl != nil && !sa {
			// As many again to the floor (floor.go), after the two
			// passes rather than between their execs: a floor request
			// between two execs would take over the spare shim's refill
			// and the holder's settling that the next exec meets.
			ffb, fstarts, err := timeExecFirstByte(fl.HC, 1, *flagExec, false)
			if err != nil {
				return fmt.Errorf("exec floor: %w", err)
			}
			fmt.Printf("exec floor (the same request and client to a bare net/http server in another process that syncs one record, starts echo into a new cgroup of its own and sends its stdout pipe over the upgraded stream; no agent code, no shim, launcher or namespaces): median %.2f ms, p99 %.2f ms, max %.2f ms over %d (the upgrade's answer alone: median %.2f ms, p99 %.2f ms)\n",
				median(ffb), quantile(ffb, 0.99), maxOf(ffb), len(ffb), median(fstarts), quantile(fstarts, 0.99))
			fmt.Printf("exec_first_byte_floor_p99_ms=%.2f\n", quantile(ffb, 0.99))
		}
	}
	if *flagAttachMiB > 0 {
		r, err := attachStream(hc, "s0", *flagAttachMiB)
		if err != nil {
			return err
		}
		fmt.Printf("cat of a %d MiB file (medians of %d rounds, interleaved): its stdout through a plain pipe %.0f MiB/s; through attach %.0f MiB/s delivered (%d bytes dropped by the ring before the stream read them); cat > /dev/null (no output copied, not the baseline) %.0f MiB/s\n",
			*flagAttachMiB, attachRounds, r.Pipe, r.Attach, r.Dropped, r.DevNull)
		fmt.Printf("attach_stream_mib_s=%.0f\nattach_stream_ratio=%.2f\n", r.Attach, r.Attach/r.Pipe)
	}
	if *flagHeld > 0 {
		agentKiB, shimKiB, err := holdProcs(hc, agentPid, *flagSessions, *flagHeld, stateDir)
		if err != nil {
			return err
		}
		fmt.Printf("%d idle processes held with an attach stream open each, over %d sessions: agent RSS +%.0f KiB per process, shims' Pss (the spares' included) %.0f KiB per process\n",
			*flagHeld, *flagSessions, agentKiB, shimKiB)
		fmt.Printf("processes_per_session_held=%.2f\nagent_rss_kib_per_attached_process=%.0f\nshim_pss_kib_per_process=%.0f\n",
			float64(*flagHeld)/float64(*flagSessions), agentKiB, shimKiB)
	}
	return nil
}

func rssMiB(pid int) float64 { return benchkit.StatusKiB(pid, "VmRSS:") / 1024 }

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		if x > m {
			m = x
		}
	}
	return m
}
