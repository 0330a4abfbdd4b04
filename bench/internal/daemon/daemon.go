//go:build linux

// Package daemon holds what the benches that drive the real shinken-agent
// daemon (make bench-agent, make bench-scale, make bench-neighbor) share:
// starting it as a service manager would, creating a session through its
// API, waiting for the API, reading its /metrics, and weighing the
// sessions' holders.
package daemon

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/dataplane"
)

var autogroupNice = flag.String("agent-autogroup-nice", "", "the daemon's -autogroup-nice (\"\": its default, -10; 0: the kernel's default weight), for an A/B of the agent's CPU weight")

// Command is the daemon's command line args (the bench's flags for it)
// plus -autogroup-nice when the bench was given -agent-autogroup-nice,
// started as a service manager starts it: leading its own session, so
// its autogroup is its own (and not the bench's) and its weight is what
// the agent sets.
func Command(bin string, args ...string) *exec.Cmd {
	if *autogroupNice != "" {
		args = append(args, "-autogroup-nice", *autogroupNice)
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// Autogroup is what /proc/PID/autogroup says of process pid's autogroup
// ("/autogroup-N nice X"), or why it cannot be read.
func Autogroup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", pid))
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

// CreateSession creates session s<i> of image bench through the API hc
// speaks to (its host is "shinken").
func CreateSession(hc *http.Client, i int) error {
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

// WaitAPI waits until GET /v1/status answers 200 through hc, trying up to
// tries times, 50 ms apart, and says whether it did.
func WaitAPI(hc *http.Client, tries int) bool {
	for i := 0; i < tries; i++ {
		if resp, err := hc.Get("http://shinken/v1/status"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// HoldersPssMiB sums the proportional set size of the processes in the
// session cgroups under parent (the daemon's -cgroup-parent; each idle
// session's one process is its holder, pid 1 of its namespace), and
// counts them. 0, 0 when the cgroup2 mount is not found.
func HoldersPssMiB(parent string) (float64, int) {
	root, err := dataplane.FindCgroup2Mount()
	if err != nil {
		return 0, 0
	}
	files, _ := filepath.Glob(filepath.Join(root, parent, "*", "cgroup.procs"))
	var kb float64
	n := 0
	for _, f := range files {
		for _, pid := range strings.Fields(benchkit.ReadTrim(f)) {
			if v, ok := benchkit.PssKiB(pid); ok {
				kb += v
				n++
			}
		}
	}
	return kb / 1024, n
}

// Metrics reads the daemon's /metrics at addr (host:port): each sample's
// value by its name, the samples of a labelled family summed under the
// family's name.
func Metrics(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		name, _, _ := strings.Cut(f[0], "{")
		m[name] += v
	}
	return m, nil
}

// HeapMiB formats the Go heap figures named (go_memstats_NAME_bytes) from
// a Metrics reading, in MiB: "heap_inuse 12.3 MiB, ...".
func HeapMiB(m map[string]float64, names ...string) string {
	var out []string
	for _, n := range names {
		out = append(out, fmt.Sprintf("%s %.1f MiB", n, m["go_memstats_"+n+"_bytes"]/(1<<20)))
	}
	return strings.Join(out, ", ")
}
