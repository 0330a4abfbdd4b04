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

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"golang.org/x/sys/unix"
)

// createSession creates session s<i> through the API.
func createSession(hc *http.Client, i int) error {
	body := fmt.Sprintf(`{"id":"s%d","image":"bench"}`, i)
	resp, err := hc.Post("http://shinken/v1/sessions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		return fmt.Errorf("create s%d: HTTP %d: %s", i, resp.StatusCode, msg)
	}
	return nil
}

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
	defer removeTree(dir)
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

// preflight: each session holds one process (its holder) and a mount, PID
// and IPC namespace; refuse a count this host cannot hold.
func preflight(sessions int) error {
	pidMax, _ := strconv.Atoi(readTrim("/proc/sys/kernel/pid_max"))
	procs := countProcs()
	fmt.Printf("host: pid_max %d, %d processes now, max mount/pid/ipc namespaces %s/%s/%s, MemAvailable %.0f MiB\n", pidMax, procs,
		readTrim("/proc/sys/user/max_mnt_namespaces"), readTrim("/proc/sys/user/max_pid_namespaces"), readTrim("/proc/sys/user/max_ipc_namespaces"), memAvailableMiB())
	if pidMax > 0 && procs+sessions+1000 > pidMax {
		return fmt.Errorf("%d sessions need %d more processes (one holder each): %d running, pid_max %d", sessions, sessions, procs, pidMax)
	}
	for _, f := range []string{"max_mnt_namespaces", "max_pid_namespaces", "max_ipc_namespaces"} {
		if n, err := strconv.Atoi(readTrim("/proc/sys/user/" + f)); err == nil && n < sessions+100 {
			return fmt.Errorf("user.%s is %d: too few for %d sessions", f, n, sessions)
		}
	}
	return nil
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

func countProcs() int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}

func memAvailableMiB() float64 { return memInfoMiB("MemAvailable:") }

// kernelMiB is the kernel's own memory that sessions grow: slab (mounts,
// superblocks, namespaces, tasks), kernel stacks and page tables.
func kernelMiB() float64 {
	return memInfoMiB("Slab:") + memInfoMiB("KernelStack:") + memInfoMiB("PageTables:")
}

func memInfoMiB(field string) float64 {
	for _, l := range strings.Split(readTrim("/proc/meminfo"), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// holdersPssMiB sums the proportional set size of the sessions' holders
// (the processes of the session cgroups under parent that are pid 1 of
// their namespace), and counts them.
func holdersPssMiB(parent string) (float64, int) {
	root, err := dataplane.FindCgroup2Mount()
	if err != nil {
		return 0, 0
	}
	files, _ := filepath.Glob(filepath.Join(root, parent, "*", "cgroup.procs"))
	var kb float64
	n := 0
	for _, f := range files {
		for _, pid := range strings.Fields(readTrim(f)) {
			for _, l := range strings.Split(readTrim("/proc/"+pid+"/smaps_rollup"), "\n") {
				if fs := strings.Fields(l); len(fs) >= 2 && fs[0] == "Pss:" {
					v, _ := strconv.ParseFloat(fs[1], 64)
					kb += v
					n++
				}
			}
		}
	}
	return kb / 1024, n
}

func loadAvg() string {
	return strings.Join(strings.Fields(readTrim("/proc/loadavg"))[:3], " ")
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
