package procs

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// readySpares waits until the rig's manager has spareCount spares ready
// and returns their pids.
func readySpares(t *testing.T, r *rig) []int {
	t.Helper()
	for i := 0; i < 500; i++ {
		r.m.mu.Lock()
		var pids []int
		for _, sp := range r.m.spares {
			pids = append(pids, sp.cmd.Process.Pid)
		}
		r.m.mu.Unlock()
		if len(pids) == spareCount {
			return pids
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%d spares not ready", spareCount)
	return nil
}

// TestStartWaitsForStartingSpare: a start that finds no spare ready while
// one is starting takes that one when it is ready, instead of starting a
// shim of its own.
func TestStartWaitsForStartingSpare(t *testing.T) {
	r := newRig(t, 0)
	readySpares(t, r)
	var spare int
	for try := 0; spare == 0; try++ {
		if try == 5 {
			t.Fatal("a spare was ready each time before it could be stopped")
		}
		spare = stoppedStartingSpare(t, r)
	}
	defer syscall.Kill(spare, syscall.SIGCONT)
	type res struct {
		p   *Proc
		err error
	}
	done := make(chan res, 1)
	go func() {
		p, err := r.m.Start(r.session, wire.ProcessStart{Argv: []string{"/bin/sleep", "30"}}, "test")
		done <- res{p, err}
	}()
	waited := false
	for i := 0; i < 1000 && !waited; i++ {
		select {
		case got := <-done:
			if got.err == nil {
				t.Fatalf("the start did not wait for the starting spare %d (its shim: %d)", spare, shimPID(t, got.p))
			}
			t.Fatalf("start: %v", got.err)
		default:
		}
		r.m.mu.Lock()
		waited = r.m.spareWaiters == 1
		r.m.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	if !waited {
		t.Fatal("the start neither waited nor returned")
	}
	syscall.Kill(spare, syscall.SIGCONT)
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if shim := shimPID(t, got.p); shim != spare {
		t.Errorf("the process's shim is %d, not the spare %d it waited for", shim, spare)
	}
}

// stoppedStartingSpare leaves r's manager with no spare ready and one
// starting, stopped (SIGSTOP), and returns its pid; 0 if it was ready
// before it could be stopped (its runtime's start takes milliseconds, the
// loop that finds it spins: rare).
func stoppedStartingSpare(t *testing.T, r *rig) int {
	t.Helper()
	readySpares(t, r)
	// As refill starts one (nothing else starts refill here).
	r.m.mu.Lock()
	sps := r.m.spares
	r.m.spares = nil
	r.m.spareStarting++
	r.m.mu.Unlock()
	for _, sp := range sps {
		sp.abandon()
	}
	go func() {
		sp, err := r.m.startSpare()
		r.m.mu.Lock()
		r.m.spareStarting--
		if err == nil {
			r.m.spares = append(r.m.spares, sp)
		}
		r.m.spareCond.Broadcast()
		r.m.mu.Unlock()
	}()
	var spare int
	for t0 := time.Now(); spare == 0 && time.Since(t0) < 10*time.Second; runtime.Gosched() {
		r.m.mu.Lock()
		for pid := range r.m.starting {
			spare = pid
		}
		ready := len(r.m.spares) > 0
		r.m.mu.Unlock()
		if spare == 0 && ready { // ready before this loop saw it start
			r.m.goRefill() // back to spareCount ready
			return 0
		}
	}
	if spare == 0 {
		t.Fatal("no spare started")
	}
	syscall.Kill(spare, syscall.SIGSTOP)
	r.m.mu.Lock()
	still := r.m.starting[spare]
	r.m.mu.Unlock()
	if !still {
		syscall.Kill(spare, syscall.SIGCONT)
		r.m.goRefill() // back to spareCount ready
		return 0
	}
	return spare
}

// TestCloseLeavesNoSpare: Close returns only once every spare, ready or
// still starting (the replacement a start begins), has exited and its
// directory is gone: nothing of a spare outlives its manager.
func TestCloseLeavesNoSpare(t *testing.T) {
	r := newRig(t, 0)
	for round := 0; round < 3; round++ {
		readySpares(t, r)
		p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/echo", "x"}})
		// The start refills at once: one is starting now, or just ready.
		r.m.mu.Lock()
		var pids []int
		for _, sp := range r.m.spares {
			pids = append(pids, sp.cmd.Process.Pid)
		}
		for pid := range r.m.starting {
			pids = append(pids, pid)
		}
		r.m.mu.Unlock()
		known := map[string]bool{}
		r.m.mu.Lock()
		for _, sp := range r.m.spares {
			known[filepath.Base(sp.dir)] = true
		}
		r.m.mu.Unlock()
		r.m.Close()
		// A spare's directory is gone when Close returns. The echo's shim,
		// still at its job when Close came, may stage a directory as its
		// job ends; it finds its socket closed and removes it as it exits.
		for try := 0; ; try++ {
			ents, err := os.ReadDir(r.cfg.Dir)
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), spareDirPrefix) {
					if known[e.Name()] {
						t.Errorf("round %d: spare directory %s left after Close", round, e.Name())
					}
					left = append(left, e.Name())
				}
			}
			if len(left) == 0 {
				break
			}
			if try == 250 {
				t.Errorf("round %d: %v left 5 s after Close", round, left)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("round %d: spare %d still there after Close: %v", round, pid, err)
			}
		}
		m, err := Open(r.cfg, nil) // adopts the process; the rig's cleanup closes it
		if err != nil {
			t.Fatal(err)
		}
		r.m = m
		if q, err := m.Get(r.session, p.ID()); err == nil {
			readAll(t, q, 0, 0, 10*time.Second)
		}
	}
}

// TestSpareTakesAnotherJob: a spare shim whose process has ended comes
// back as a spare, holding nothing of that job (no descriptor under its
// directory, its deadline stopped), and its next job, in the same shim,
// runs as a fresh shim's would; the first job's records stay as written.
func TestSpareTakesAnotherJob(t *testing.T) {
	r := newRig(t, 0)
	readySpares(t, r)
	first := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "echo one; sleep 0.3"}, DeadlineS: 1.5})
	shim := shimPID(t, first)
	if v := wait(t, first); v.Reason != "exit" {
		t.Fatalf("first job: %+v", v)
	}
	back := false
	for i := 0; i < 250 && !back; i++ {
		r.m.mu.Lock()
		for _, sp := range r.m.spares {
			back = back || sp.cmd.Process.Pid == shim
		}
		r.m.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	if !back {
		t.Fatalf("shim %d did not come back as a spare", shim)
	}
	fds, _ := os.ReadDir("/proc/" + strconv.Itoa(shim) + "/fd")
	for _, fd := range fds {
		if to, _ := os.Readlink("/proc/" + strconv.Itoa(shim) + "/fd/" + fd.Name()); strings.HasPrefix(to, first.dir) {
			t.Errorf("shim %d still holds %s of its first job", shim, to)
		}
	}
	// The spare taken next is the last one kept: this shim.
	second := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "sleep 2; echo two"}})
	if got := shimPID(t, second); got != shim {
		t.Fatalf("second job's shim %d, want %d", got, shim)
	}
	if out, _ := readAll(t, second, 0, 0, 10*time.Second); out != "two\n" {
		t.Errorf("second job's output %q", out)
	}
	// It ran past the first job's deadline (1.5 s after the first start).
	if v := wait(t, second); v.Reason != "exit" || v.ExitCode == nil || *v.ExitCode != 0 {
		t.Errorf("second job: %+v (the first job's deadline reached it?)", v)
	}
	if out, _ := readAll(t, first, 0, 0, 5*time.Second); out != "one\n" {
		t.Errorf("first job's output after the second: %q", out)
	}
	r.m.mu.Lock()
	reused := r.m.reused
	r.m.mu.Unlock()
	if reused < 1 {
		t.Errorf("reused %d", reused)
	}
}

// TestShortJobsEndAsExited: processes that end at once, started one after
// another through spares that come back between them, each end as exited
// with their output, never lost: a shim closes its listener once exit.json
// is written, so an agent whose connection comes after that reads the
// record instead.
func TestShortJobsEndAsExited(t *testing.T) {
	r := newRig(t, 0)
	readySpares(t, r)
	for i := 0; i < 60; i++ {
		p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/echo", strconv.Itoa(i)}})
		if v := wait(t, p); v.State != wire.ProcExited || v.Reason != "exit" {
			t.Fatalf("start %d: %+v", i, v)
		}
		if out, _ := readAll(t, p, 0, 0, 5*time.Second); out != strconv.Itoa(i)+"\n" {
			t.Fatalf("start %d: output %q", i, out)
		}
	}
	r.m.mu.Lock()
	reused := r.m.reused
	r.m.mu.Unlock()
	if reused == 0 {
		t.Error("no shim was taken back")
	}
	t.Logf("%d shims taken back over 60 starts", reused)
}

// TestWorkingShimEndsWithoutItsManager: a spare running a job when its
// manager closes (its agent gone) keeps the job running, and once the job
// ends it exits instead of waiting as a spare no agent can reach; a new
// manager reads the job's exit.
func TestWorkingShimEndsWithoutItsManager(t *testing.T) {
	r := newRig(t, 0)
	readySpares(t, r)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "sleep 0.5; echo done"}})
	shim := shimPID(t, p)
	r.m.Close()
	q := reopen(t, r, p, nil)
	if v := wait(t, q); v.Reason != "exit" {
		t.Fatalf("after the manager closed: %+v", v)
	}
	for i := 0; i < 250; i++ {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(shim) + "/cmdline")
		if err != nil || len(b) == 0 {
			if left, _ := filepath.Glob(filepath.Join(r.cfg.Dir, spareDirPrefix+"*")); len(left) > spareCount {
				t.Errorf("spare directories left: %v", left)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("shim %d outlived its job with no manager", shim)
}
