//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/daemon"
)

// result is what one count's measurement found.
type result struct {
	n                     int
	creates               []float64 // ms, every creation of the growth that reached n
	from                  int       // the count that growth started at
	ratio, twin           float64   // connect ratios to the baseline: shinken's and the twin's (the floor)
	scrape, list, rss     float64   // ms, ms, MiB
	fds                   int
	kernMiB, pssMiB       float64
	holders, procs        int
	scrapeBytes, listedOK int
	restart               restarted
	err                   error
}

// measure measures the agent at n live sessions; creates are the times of
// the growth that reached n.
func (b *bench) measure(n int, creates []float64, kern0 float64) result {
	r := result{n: n, creates: creates, from: n - len(creates)}
	fmt.Printf("at %d sessions (load average %s, MemAvailable %.0f MiB):\n", n, benchkit.LoadAvg(), benchkit.MemInfoMiB("MemAvailable:"))
	s := append([]float64(nil), creates...)
	sortFloats(s)
	fmt.Printf("  session create (no holder until its first launch) one at a time over %d-%d live sessions: median %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms over %d\n",
		r.from, n, benchkit.Q(s, 0.5), benchkit.Q(s, 0.99), benchkit.Q(s, 0.999), benchkit.Q(s, 1), len(s))
	if r.ratio, r.twin, r.err = b.eg.rounds(); r.err != nil {
		return r
	}
	var scrapes, lists []float64
	for i := 0; i < *flagScrapes; i++ {
		t0 := time.Now()
		resp, err := http.Get("http://" + b.metrics + "/metrics")
		if err != nil {
			r.err = err
			return r
		}
		nb, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		scrapes = append(scrapes, float64(time.Since(t0).Microseconds())/1e3)
		r.scrapeBytes = int(nb)
		ms, err := b.listSessions(n)
		if err != nil {
			r.err = err
			return r
		}
		lists = append(lists, ms)
	}
	if *flagPprof != "" {
		if err := b.profile(n); err != nil {
			r.err = err
			return r
		}
	}
	sortFloats(scrapes)
	sortFloats(lists)
	r.scrape, r.list = benchkit.Q(scrapes, 0.5), benchkit.Q(lists, 0.5)
	pid := b.agent.Process.Pid
	r.rss = benchkit.StatusKiB(pid, "VmRSS:") / 1024
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	r.fds = len(fds)
	r.kernMiB = benchkit.KernelMiB() - kern0
	r.pssMiB, r.holders = daemon.HoldersPssMiB(b.parent)
	r.procs = benchkit.CountProcs()
	fmt.Printf("  /metrics scrape (%d bytes): median %.1f ms, max %.1f ms over %d; session ls (shinkenctl -o json): median %.1f ms, max %.1f ms\n",
		r.scrapeBytes, r.scrape, benchkit.Q(scrapes, 1), len(scrapes), r.list, benchkit.Q(lists, 1))
	fmt.Printf("  agent: RSS %.1f MiB (%.1f KiB per session), %d open files, %s threads; %d holders, Pss %.1f MiB in all (%.1f KiB each); kernel slab+stacks+page tables +%.0f MiB since the start (%.0f KiB per session; the whole host's); processes on the host %d (pid_max %s)\n",
		r.rss, r.rss*1024/float64(n), r.fds, strconv.Itoa(int(benchkit.StatusKiB(pid, "Threads:"))), r.holders, r.pssMiB, r.pssMiB*1024/float64(max(1, r.holders)),
		r.kernMiB, r.kernMiB*1024/float64(n), r.procs, benchkit.ReadTrim("/proc/sys/kernel/pid_max"))
	return r
}

func (r result) print() {
	s := append([]float64(nil), r.creates...)
	sortFloats(s)
	l := label(r.n)
	fmt.Printf("egress_connect_ratio_vs_baseline_at_%s=%.3f\n", l, r.ratio)
	fmt.Printf("egress_connect_twin_ratio_at_%s=%.3f\n", l, r.twin)
	fmt.Printf("scrape_ms_at_%s_sessions=%.1f\n", l, r.scrape)
	fmt.Printf("session_ls_ms_at_%s_sessions=%.1f\n", l, r.list)
	fmt.Printf("agent_rss_mib_at_%s_sessions=%.1f\n", l, r.rss)
	fmt.Printf("session_create_p99_ms_at_%s=%.2f\n", l, benchkit.Q(s, 0.99))
	fmt.Printf("agent_restart_ms_at_%s_sessions=%.0f\n", l, r.restart.ms)
	fmt.Printf("agent_rss_mib_after_restart_at_%s_sessions=%.1f\n", l, r.restart.rss)
}

// listSessions runs shinkenctl session ls and checks that it lists n
// sessions; it returns how long the command took in ms (its output's
// parsing not counted).
func (b *bench) listSessions(n int) (float64, error) {
	t0 := time.Now()
	out, err := exec.Command(b.ctl, "-socket", b.sock, "-o", "json", "session", "ls").Output()
	if err != nil {
		return 0, fmt.Errorf("session ls: %v", err)
	}
	ms := float64(time.Since(t0).Microseconds()) / 1e3
	var ss []json.RawMessage
	if err := json.Unmarshal(out, &ss); err != nil {
		return ms, fmt.Errorf("session ls: %v", err)
	}
	if len(ss) != n {
		return ms, fmt.Errorf("session ls listed %d sessions, want %d", len(ss), n)
	}
	return ms, nil
}
