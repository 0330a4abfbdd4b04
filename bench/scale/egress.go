//go:build linux

package main

// The connect rounds, by make bench-egress's method (bench/egress: one
// worker process started through the session launcher, moved before each
// round into the contender's cgroup and pinned to CPU 0, the accept server
// on CPU 1; short interleaved rounds in rotating order after the same idle
// pause; the figure is the median of per-round ratios, with a twin of the
// baseline as the method's floor). Here the Shinken contender is one of
// the daemon's own sessions (s0, granted net.egress to the server through
// the API), and the worker starts through the same launcher in a session
// of the bench's own (its own cgroup outside the daemon's parent, its uid,
// namespaces, seccomp filter and Landlock), as bench-egress's worker does
// in its dataplane's session. The sessions carry no egress entries but
// s0's grant (bench-egress loads 100 per session).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/probe"
	"golang.org/x/sys/unix"
)

type egress struct {
	b              *bench
	probeDir       string
	bnd            *boundary.Boundary
	wDir           string // the worker session's cgroup parent (the bench's)
	baseCg, twinCg string
	srv            *server
	cmd            *exec.Cmd
	in             io.WriteCloser
	out            *bufio.Scanner
	tid            int // the worker's command thread, host tid
	granted        bool
}

func newEgress(b *bench) (*egress, error) {
	root, err := findCgroupRoot()
	if err != nil {
		return nil, err
	}
	e := &egress{b: b}
	fail := func(err error) (*egress, error) { e.close(); return nil, err }
	// Under /var/tmp: a session's /tmp is its own.
	if e.probeDir, err = os.MkdirTemp("/var/tmp", "shinken-bench-scale-"); err != nil {
		return fail(err)
	}
	os.Chmod(e.probeDir, 0o755)
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(e.probeDir, "probe"), data, 0o755); err != nil {
		return fail(err)
	}
	e.baseCg = filepath.Join(root, "shinken-bench-scale-base-"+b.tag)
	e.twinCg = filepath.Join(root, "shinken-bench-scale-twin-"+b.tag)
	for _, cg := range []string{e.baseCg, e.twinCg} {
		if err := os.Mkdir(cg, 0o755); err != nil {
			return fail(err)
		}
	}
	e.wDir = filepath.Join(root, "shinken-bench-scale-worker-"+b.tag)
	if err := os.MkdirAll(filepath.Join(e.wDir, "w"), 0o755); err != nil {
		return fail(err)
	}
	abs, _ := filepath.Abs(filepath.Join(*flagBin, boundary.LauncherName))
	if e.bnd, err = boundary.New(boundary.Config{Launcher: abs}, 1<<20); err != nil {
		return fail(err)
	}
	// A uid index above every index of the daemon's (its uids are the
	// same default range).
	if err := e.bnd.Create("w", filepath.Join(e.wDir, "w"), uint32(b.maxSessions+1000)); err != nil {
		return fail(err)
	}
	srvCPU := -1
	if *flagPin && numCPU() > 1 {
		srvCPU = 1
	}
	if e.srv, err = acceptAndClose(netip.MustParseAddrPort("127.0.0.2:0"), srvCPU); err != nil {
		return fail(err)
	}
	e.cmd = exec.Command(filepath.Join(e.probeDir, "probe"))
	e.cmd.Env = []string{probe.EnvVar + "=1"}
	e.cmd.Dir = "/"
	e.cmd.Stderr = os.Stderr
	if e.in, err = e.cmd.StdinPipe(); err != nil {
		return fail(err)
	}
	outp, err := e.cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	if err := e.bnd.Launch("w", e.cmd, boundary.LaunchOptions{}, false); err != nil {
		e.cmd = nil
		return fail(fmt.Errorf("start the worker through the launcher: %w", err))
	}
	e.out = bufio.NewScanner(outp)
	if _, err := fmt.Sscanf(e.do("tid"), "ok %d", &e.tid); err != nil {
		return fail(fmt.Errorf("worker thread id: %w", err))
	}
	e.tid = hostTID(e.cmd.Process.Pid, e.tid)
	fmt.Printf("connect worker: %s\n", e.bnd.Launcher())
	return e, nil
}

func (e *egress) do(line string) string {
	if _, err := io.WriteString(e.in, line+"\n"); err != nil {
		return "err " + err.Error()
	}
	if !e.out.Scan() {
		return fmt.Sprintf("err worker died: %v", e.out.Err())
	}
	return e.out.Text()
}

func (e *egress) moveTo(cg string) error {
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(e.cmd.Process.Pid)), 0); err != nil {
		return fmt.Errorf("move the worker to %s: %w", cg, err)
	}
	return nil
}

// grant gives s0 net.egress to the accept server through the API, after
// checking that s0 refuses it before.
func (e *egress) grant() error {
	s0 := filepath.Join(cgroupRoot, e.b.parent, "s0")
	if err := e.moveTo(s0); err != nil {
		return err
	}
	port := strconv.Itoa(int(e.srv.addr.Port()))
	if got := e.do("tcp " + e.srv.addr.String()); got != "err EPERM" {
		return fmt.Errorf("s0 before its grant: connect %s: %s, want err EPERM", e.srv.addr, got)
	}
	req := agent.GrantRequest{Session: "s0", Lifecycle: agent.LifecycleSession, Capability: agent.Capability{
		Class: agent.ClassNetEgress,
		Egress: &agent.EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(e.srv.addr.Addr(), 32)},
			Ports: []agent.PortRange{{Lo: e.srv.addr.Port(), Hi: e.srv.addr.Port()}}},
	}}
	var res []api.RequestResult
	code, err := post(e.b.hc, "/v1/requests", api.RequestBody{Requests: []agent.GrantRequest{req}}, &res)
	if err != nil {
		return err
	}
	if len(res) != 1 || res[0].Outcome != "granted" || code != http.StatusCreated {
		return fmt.Errorf("grant net.egress %s to s0: HTTP %d: %+v", e.srv.addr, code, res)
	}
	if got := e.do("tcp " + e.srv.addr.String()); got != "ok" {
		return fmt.Errorf("s0 after its grant: connect %s: %s, want ok", e.srv.addr, got)
	}
	if got := e.do("tcp 127.0.0.3:" + port); got != "err EPERM" {
		return fmt.Errorf("s0 after its grant: connect 127.0.0.3:%s: %s, want err EPERM (the session is not enforced)", port, got)
	}
	e.granted = true
	return nil
}

// rounds runs the interleaved connect rounds and returns the medians of
// the per-round ratios to the baseline: the session's and the twin's.
func (e *egress) rounds() (ratio, twin float64, err error) {
	if !e.granted {
		if err := e.grant(); err != nil {
			return 0, 0, err
		}
	}
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(e.tid, &all); err != nil {
		return 0, 0, err
	}
	if *flagPin && numCPU() > 1 {
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(e.tid, &set); err != nil {
			return 0, 0, fmt.Errorf("pin the worker to CPU 0: %w", err)
		}
		defer unix.SchedSetaffinity(e.tid, &all)
	}
	names := []string{"baseline", "shinken", "twin"}
	cgs := []string{e.baseCg, filepath.Join(cgroupRoot, e.b.parent, "s0"), e.twinCg}
	rates := make([][]float64, 3)
	flood := fmt.Sprintf("tcpflood 0 %s %g", e.srv.addr, *flagSecs)
	for r := 0; r < *flagRounds; r++ {
		for i := range cgs {
			c := (i + r) % len(cgs)
			if err := e.moveTo(cgs[c]); err != nil {
				return 0, 0, err
			}
			time.Sleep(*flagSettle)
			rates[c] = append(rates[c], rate(e.do(flood)))
		}
	}
	// Out of s0 between measurements: the processes counted in the session
	// cgroups are then the holders alone.
	if err := e.moveTo(e.baseCg); err != nil {
		return 0, 0, err
	}
	fmt.Printf("  connect+close per second, %d rounds of %gs, median of rounds:", *flagRounds, *flagSecs)
	for i, n := range names {
		fmt.Printf("  %s %.0f", n, median(rates[i]))
	}
	fmt.Println()
	shk, tw := pairs(rates[1], rates[0]), pairs(rates[2], rates[0])
	for _, p := range []struct {
		what string
		v    []float64
	}{{"shinken/baseline", shk}, {"twin/baseline (the bench's floor: nothing differs)", tw}} {
		lo, hi := medianCI(p.v)
		fmt.Printf("  per-round ratio %s: median %.3f, 95%% CI %.3f–%.3f over %d rounds\n", p.what, median(p.v), lo, hi, len(p.v))
	}
	if len(shk) < *flagRounds/2 {
		return 0, 0, fmt.Errorf("only %d of %d connect rounds gave a rate", len(shk), *flagRounds)
	}
	return median(shk), median(tw), nil
}

// close stops the worker and the server and removes the bench's cgroups,
// its boundary session and the probe's copy.
func (e *egress) close() {
	if e.cmd != nil && e.cmd.Process != nil {
		e.in.Close()
		e.cmd.Process.Kill()
		e.cmd.Wait()
	}
	if e.srv != nil {
		e.srv.Close()
	}
	if e.bnd != nil {
		e.bnd.Release("w")
		e.bnd.Close()
	}
	if e.wDir != "" {
		rmCgroup(filepath.Join(e.wDir, "w"))
		rmCgroup(e.wDir)
	}
	rmCgroup(e.baseCg)
	rmCgroup(e.twinCg)
	if e.probeDir != "" {
		os.RemoveAll(e.probeDir)
	}
}

func rmCgroup(p string) {
	if p == "" {
		return
	}
	os.WriteFile(filepath.Join(p, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 300; i++ {
		if err := unix.Rmdir(p); err == nil || errors.Is(err, unix.ENOENT) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "could not remove cgroup %s\n", p)
}

// server is the accept-and-close server of the connect rounds (as
// bench/egress's): one OS thread blocked in accept(2), pinned to one CPU
// when cpu >= 0, closing what it accepts.
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
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}); err == nil {
		err = unix.Listen(fd, 4096)
	}
	sa, err2 := unix.Getsockname(fd)
	if err == nil {
		err = err2
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	srv := &server{fd: fd, addr: netip.AddrPortFrom(addr.Addr(), uint16(sa.(*unix.SockaddrInet4).Port)), done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(srv.done)
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
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
		unix.Close(fd)
		return nil, err
	}
	return srv, nil
}

// Close stops the accept thread and closes the socket.
func (s *server) Close() {
	unix.Shutdown(s.fd, unix.SHUT_RDWR) // wakes the blocked accept
	<-s.done
	unix.Close(s.fd)
}

// hostTID maps a thread id that process pid reports from inside its
// session's PID namespace to the host's.
func hostTID(pid, nsTID int) int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		for _, l := range strings.Split(readTrim(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name())), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				if f := strings.Fields(v); len(f) > 0 && f[len(f)-1] == strconv.Itoa(nsTID) {
					id, _ := strconv.Atoi(t.Name())
					return id
				}
			}
		}
	}
	return nsTID
}

// rate turns "ok COUNT NS ..." into COUNT per second (0 on error).
func rate(line string) float64 {
	var n, ns int64
	f := strings.Fields(line)
	if _, err := fmt.Sscanf(strings.Join(f[:min(3, len(f))], " "), "ok %d %d", &n, &ns); err != nil || ns == 0 {
		fmt.Fprintf(os.Stderr, "worker: %s\n", line)
		return 0
	}
	return float64(n) / (float64(ns) / 1e9)
}

// pairs returns a[i]/b[i] for the rounds where both ran.
func pairs(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

// medianCI is the distribution-free 95 % confidence interval of the median.
func medianCI(v []float64) (lo, hi float64) {
	n := len(v)
	if n == 0 {
		return 0, 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	d := 1.96 * math.Sqrt(float64(n)) / 2
	j := max(int(math.Floor(float64(n)/2-d)), 1)
	k := min(int(math.Ceil(float64(n)/2+d+1)), n)
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

// post sends body as JSON to the daemon and decodes the answer into out.
func post(hc *http.Client, path string, body, out any) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Post("http://shinken"+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	msg, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return resp.StatusCode, err
	}
	if err := json.Unmarshal(msg, out); err != nil {
		return resp.StatusCode, fmt.Errorf("%s: HTTP %d: %v: %s", path, resp.StatusCode, err, msg)
	}
	return resp.StatusCode, nil
}
