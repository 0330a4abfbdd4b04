//go:build linux

package main

import (
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/daemon"
)

// restarted is what one restart at a count found.
type restarted struct {
	ms        float64 // the start to the API's first answer
	rss0, rss float64 // VmRSS then, and -restart-settle later
}

var flagSettleRestart = flag.Duration("restart-settle", 10*time.Second, "after a restart, how long to wait before reading the daemon's settled RSS")

// restart kills the daemon with SIGKILL at n live sessions (a crash: no
// clean shutdown, nothing flushed but what the daemon made durable) and
// starts it again on the same state directory, pins and cgroup parent,
// timed from the start of the process to the first answered GET
// /v1/status (the daemon answers only once it has opened the kernel state
// and adopted every session and grant). It then checks that the adoption
// kept every session (session ls lists n) and what enforces: s0's grant
// still lets the worker reach the accept server and still refuses another
// address.
func (b *bench) restart(n int) (restarted, error) {
	b.mu.Lock()
	b.agent.Process.Kill()
	b.agent.Wait()
	b.agent = nil
	b.alog.Reset()
	b.mu.Unlock()
	t0 := time.Now()
	if err := b.launchAgent(); err != nil {
		return restarted{}, err
	}
	var ms float64
	for {
		if resp, err := b.hc.Get("http://shinken/v1/status"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ms = float64(time.Since(t0).Microseconds()) / 1e3
				break
			}
		}
		if time.Since(t0) > 10*time.Minute {
			return restarted{}, fmt.Errorf("restart at %d sessions: no API within 10 minutes:\n%s", n, b.alog.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := restarted{ms: ms, rss0: benchkit.StatusKiB(b.agent.Process.Pid, "VmRSS:") / 1024}
	if err := b.eg.stillGranted(); err != nil {
		return r, fmt.Errorf("after the restart at %d sessions: %w", n, err)
	}
	if _, err := b.listSessions(n); err != nil {
		return r, fmt.Errorf("after the restart at %d sessions: %w", n, err)
	}
	time.Sleep(*flagSettleRestart)
	r.rss = benchkit.StatusKiB(b.agent.Process.Pid, "VmRSS:") / 1024
	fmt.Printf("  restart (SIGKILL, then the daemon on the same state, pins and cgroups): the API answered %.0f ms after the start; s0's grant still enforced; RSS %.1f MiB then, %.1f MiB %v later (%s)\n",
		r.ms, r.rss0, r.rss, *flagSettleRestart, b.heap())
	return r, nil
}

// heap reads the daemon's Go heap figures from its /metrics.
func (b *bench) heap() string {
	m, err := daemon.Metrics(b.metrics)
	if err != nil {
		return err.Error()
	}
	return daemon.HeapMiB(m, "heap_inuse", "heap_idle", "heap_released")
}
