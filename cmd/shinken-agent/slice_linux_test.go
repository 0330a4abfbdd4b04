//go:build linux

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// sliceOf reads a task's EEVDF slice (ns) from its sched file.
func sliceOf(t *testing.T, sched string) uint64 {
	t.Helper()
	for _, line := range strings.Split(sched, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "se.slice" {
			v, err := strconv.ParseUint(f[2], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no se.slice in %q", sched)
	return 0
}

// TestSliceKeeper: every thread of the agent gets the slice, threads the
// runtime makes later get it at the next keep, and no process the agent
// starts inherits it (reset on fork): a child reads the kernel's default.
func TestSliceKeeper(t *testing.T) {
	def, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	k := newSliceKeeper(defaultSliceUS)
	if k.err != nil {
		if strings.Contains(k.err.Error(), "6.12") {
			t.Skipf("this kernel keeps no fair slice: %v", k.err)
		}
		t.Fatal(k.err)
	}
	t.Cleanup(func() { setSliceAll(def.Runtime) })
	threads := func() []int {
		ents, _ := os.ReadDir("/proc/self/task")
		var out []int
		for _, e := range ents {
			tid, _ := strconv.Atoi(e.Name())
			out = append(out, tid)
		}
		return out
	}
	for _, tid := range threads() {
		a, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			continue // ended
		}
		if a.Runtime != 100_000 || a.Flags&unix.SCHED_FLAG_RESET_ON_FORK == 0 {
			t.Errorf("thread %d: slice %d, flags %#x", tid, a.Runtime, a.Flags)
		}
	}
	if !strings.Contains(k.fact(), "0.1 ms EEVDF slice") {
		t.Errorf("fact %q", k.fact())
	}
	// New threads (locked goroutines take threads of their own) start
	// without it
	release := make(chan struct{})
	tids := make(chan int)
	for i := 0; i < 4; i++ {
		go func() {
			runtime.LockOSThread()
			tids <- unix.Gettid()
			<-release
		}()
	}
	var fresh []int
	for i := 0; i < 4; i++ {
		fresh = append(fresh, <-tids)
	}
	// (or the runtime reuses a parked one that has it) and have it after
	// keep.
	k.keep()
	for _, tid := range fresh {
		if a, err := unix.SchedGetAttr(tid, 0); err != nil || a.Runtime != 100_000 {
			t.Errorf("new thread %d after keep: %+v %v", tid, a, err)
		}
	}
	close(release)
	// A child process, started from a thread with the slice, has the
	// kernel's default.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	k.keep()
	if a, _ := unix.SchedGetAttr(0, 0); a.Runtime != 100_000 {
		t.Fatalf("this thread: slice %d", a.Runtime)
	}
	out, err := exec.Command("/bin/cat", "/proc/self/sched").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := sliceOf(t, string(out)); got == 100_000 || got != def.Runtime {
		t.Errorf("a child of the agent has slice %d, want the kernel's default %d", got, def.Runtime)
	}
}

// TestSliceConfig: agent_cpu_slice_us takes 0 (the default), -1 (off) and
// 100 to 100000, and refuses anything else with its name.
func TestSliceConfig(t *testing.T) {
	for _, ok := range []string{"0", "-1", "100", "2500", "100000"} {
		if _, _, err := load([]string{"-config", "", "-cpu-slice-us", ok}); err != nil {
			t.Errorf("-cpu-slice-us %s: %v", ok, err)
		}
	}
	for _, bad := range []string{"99", "-2", "100001"} {
		if _, _, err := load([]string{"-config", "", "-cpu-slice-us", bad}); err == nil || !strings.Contains(err.Error(), "agent_cpu_slice_us") {
			t.Errorf("-cpu-slice-us %s: err %v, want an error naming agent_cpu_slice_us", bad, err)
		}
	}
	file := filepath.Join(t.TempDir(), "agent.json")
	os.WriteFile(file, []byte(`{"agent_cpu_slice_us": 50}`), 0o600)
	if _, _, err := load([]string{"-config", file}); err == nil || !strings.Contains(err.Error(), "agent_cpu_slice_us 50") {
		t.Errorf("agent_cpu_slice_us 50 in the file: %v", err)
	}
	if k := newSliceKeeper(-1); !strings.Contains(k.fact(), "off") {
		t.Errorf("off: %q", k.fact())
	}
}
