//go:build linux

// Package daemon holds what the benches that drive the real shinken-agent
// daemon (make bench-agent, make bench-scale) share: creating a session
// through its API, waiting for the API, and weighing the sessions'
// holders.
package daemon

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/dataplane"
)

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
