//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/teardown"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"golang.org/x/sys/unix"
)

// timeAPIRun times `run s0 -- /bin/true` through the daemon's API.
func timeAPIRun(hc *http.Client) ([]float64, error) {
	var out []float64
	for i := 0; i < 30; i++ {
		t0 := time.Now()
		resp, err := hc.Post("http://shinken/v1/sessions/s0/run", "application/json", strings.NewReader(`{"argv":["/bin/true"]}`))
		if err != nil {
			return nil, err
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var res struct {
			ExitCode int `json:"exit_code"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(msg, &res) != nil || res.ExitCode != 0 {
			return nil, fmt.Errorf("run s0 -- /bin/true: HTTP %d: %s", resp.StatusCode, msg)
		}
		out = append(out, float64(time.Since(t0).Microseconds())/1e3)
	}
	return out, nil
}

// timeLaunch makes a session of the bench's own (its cgroup under a
// private parent, its namespaces and holder, uid index index) with the
// same boundary code and launcher binary as the daemon, and times a launch
// of /bin/true in it (as a run: its own cgroup) against a plain spawn of
// /bin/true, interleaved. Times in ms.
func timeLaunch(bin string, index uint32, n int) (launch, plain []float64, launcher string, err error) {
	root, err := dataplane.FindCgroup2Mount()
	if err != nil {
		return nil, nil, "", err
	}
	dir := filepath.Join(root, fmt.Sprintf("shinken-bench-agent-launch-%d", os.Getpid()))
	if err := os.MkdirAll(filepath.Join(dir, "s"), 0o755); err != nil {
		return nil, nil, "", err
	}
	defer teardown.Add(func() { removeTree(dir) })()
	abs, _ := filepath.Abs(filepath.Join(bin, boundary.LauncherName))
	b, err := boundary.New(boundary.Config{Launcher: abs}, 1<<20)
	if err != nil {
		return nil, nil, "", err
	}
	defer b.Close()
	if err := b.Create("s", filepath.Join(dir, "s"), index); err != nil {
		return nil, nil, "", err
	}
	defer b.Release("s")
	for i := 0; i < n+5; i++ {
		t0 := time.Now()
		cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Dir: "/"}
		if err := b.Launch("s", cmd, boundary.LaunchOptions{}, true); err != nil {
			return nil, nil, "", err
		}
		if err := cmd.Wait(); err != nil {
			return nil, nil, "", fmt.Errorf("launched /bin/true: %w", err)
		}
		l := float64(time.Since(t0).Nanoseconds()) / 1e6
		t0 = time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return nil, nil, "", err
		}
		p := float64(time.Since(t0).Nanoseconds()) / 1e6
		if i >= 5 { // warm-up
			launch, plain = append(launch, l), append(plain, p)
		}
	}
	return launch, plain, b.Launcher(), nil
}

// removeTree kills and removes a cgroup directory the bench made.
func removeTree(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeTree(filepath.Join(dir, e.Name()))
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 500; i++ {
		if err := unix.Rmdir(dir); err == nil || err == unix.ENOENT {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// preflight: a session the bench launches into holds one process (its
// holder, started at the first launch) and a mount, PID and IPC namespace;
// the exec and held-process phases launch into sessions spread over the
// count, so it is held to one holder per session, an upper bound; refuse a
// count this host could not hold.
func preflight(sessions int) error {
	pidMax, _ := strconv.Atoi(benchkit.ReadTrim("/proc/sys/kernel/pid_max"))
	procs := benchkit.CountProcs()
	fmt.Printf("host: pid_max %d, %d processes now, max mount/pid/ipc namespaces %s/%s/%s, MemAvailable %.0f MiB\n", pidMax, procs,
		benchkit.ReadTrim("/proc/sys/user/max_mnt_namespaces"), benchkit.ReadTrim("/proc/sys/user/max_pid_namespaces"), benchkit.ReadTrim("/proc/sys/user/max_ipc_namespaces"), benchkit.MemInfoMiB("MemAvailable:"))
	if pidMax > 0 && procs+sessions+1000 > pidMax {
		return fmt.Errorf("%d sessions may need %d more processes (at most one holder each): %d running, pid_max %d", sessions, sessions, procs, pidMax)
	}
	for _, f := range []string{"max_mnt_namespaces", "max_pid_namespaces", "max_ipc_namespaces"} {
		if n, err := strconv.Atoi(benchkit.ReadTrim("/proc/sys/user/" + f)); err == nil && n < sessions+100 {
			return fmt.Errorf("user.%s is %d: too few for %d sessions", f, n, sessions)
		}
	}
	return nil
}

// quantile is the nearest-rank q-quantile.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[int(math.Ceil(q*float64(len(s))))-1]
}
