package boundary

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Bounds of TestCost. The counts are exact properties; the two time ratios
// are ratios of minimums against a plain spawn measured interleaved in the
// same test, with wide margins (a loaded machine slows both sides, and the
// minimum of twenty is the least disturbed sample): they catch a sleep, a
// poll or a retry loop added to a path, not a few percent (bench-agent's
// session_create_p99_ms and run_spawn_overhead_ratio measure those).
const (
	costHolderRSSKiB     = 4 << 10 // catatonit: about 0.7 MiB; a Go or Python holder: 5 MiB and more
	costHolderAnonKiB    = 1 << 10 // catatonit: about 44 KiB
	costCreateVsSpawnMax = 10      // measured 1.0-1.2 (one session create vs one fork+exec of /bin/true)
	costLaunchVsSpawnMax = 10      // measured 1.5-1.8 with the C launcher, 3.4-4.1 with the Go one
)

// TestCost asserts what a session and a launch cost the agent and the host
// (the issue 22 review found it only logged). Per session: no process
// after create (lazy start, issue 21); once launched into, one process, the
// holder, in one cgroup, a catatonit of one thread and at most
// costHolderRSSKiB resident; the agent's thread count does not grow with
// the sessions (the thread that builds a holder's mounts ends with it; its
// descriptors are TestHolderNoDescriptors'). Per launch of /bin/true
// through the boundary in its own run cgroup, waited: nothing left behind
// (no process, no run cgroup, no descriptor or thread in the agent). And a
// session create and a launch each within a bound ratio of a plain spawn.
func TestCost(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	const n = 20
	spawn := func() time.Duration {
		t0 := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	}
	fds0, threads0 := countFDs(t), statusNumber(t, os.Getpid(), "Threads")
	var create, plainC []time.Duration
	var dirs []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("cost%d", i)
		dir := filepath.Join(cgParent, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Release(name); removeCgroupTree(dir) })
		t0 := time.Now()
		if err := b.Create(name, dir, uint32(100+i)); err != nil {
			t.Fatal(err)
		}
		create = append(create, time.Since(t0))
		plainC = append(plainC, spawn())
		dirs = append(dirs, dir)
	}
	// Lazy start (issue 21): a session costs no process until it needs
	// one; a first launch into each starts its holder.
	for i, dir := range dirs {
		if procs, cgs := cgroupTree(t, dir); procs != 0 || cgs != 1 {
			t.Errorf("session %d after create: %d processes in %d cgroups, want none in the session cgroup", i, procs, cgs)
		}
		startHolderIn(t, b, fmt.Sprintf("cost%d", i))
	}
	for _, dir := range dirs {
		// The launch's run cgroup goes once its process has exited (endRun).
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if _, cgs := cgroupTree(t, dir); cgs == 1 {
				break
			}
		}
	}
	if grew := statusNumber(t, os.Getpid(), "Threads") - threads0; grew >= n/2 {
		t.Errorf("%d sessions: the agent has %d more threads", n, grew)
	}
	for i, dir := range dirs {
		if procs, cgs := cgroupTree(t, dir); procs != 1 || cgs != 1 {
			t.Errorf("session %d: %d processes in %d cgroups, want the holder alone in the session cgroup", i, procs, cgs)
		}
	}
	pid := b.holders["cost0"].pid
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	rss, anon, threads := statusNumber(t, pid, "VmRSS"), statusNumber(t, pid, "RssAnon"), statusNumber(t, pid, "Threads")
	t.Logf("holder %s: VmRSS %d kB, RssAnon %d kB, Threads %d", strings.TrimSpace(string(comm)), rss, anon, threads)
	if threads != 1 || rss > costHolderRSSKiB || anon > costHolderAnonKiB {
		t.Errorf("holder: %d threads, VmRSS %d kB, RssAnon %d kB; want 1 thread, at most %d and %d kB", threads, rss, anon, costHolderRSSKiB, costHolderAnonKiB)
	}

	fds1, threads1 := countFDs(t), statusNumber(t, os.Getpid(), "Threads")
	var launch, plainL []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Dir: "/"}
		if err := b.Launch("cost0", cmd, LaunchOptions{}, true); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		launch = append(launch, time.Since(t0))
		plainL = append(plainL, spawn())
	}
	// Run cgroups are removed by a goroutine per run once its process has
	// exited (endRun): wait for them, a while.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		procs, cgs := cgroupTree(t, dirs[0])
		if procs == 1 && cgs == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("5 s after %d launches: %d processes in %d cgroups, want the holder alone (each run cgroup removed)", n, procs, cgs)
			break
		}
	}
	if fds, threads := countFDs(t)-fds1, statusNumber(t, os.Getpid(), "Threads")-threads1; fds >= n/2 || threads >= n/2 {
		t.Errorf("%d launches: the agent holds %d more descriptors and %d more threads", n, fds, threads)
	}
	t.Logf("agent: %d descriptors, %d threads before the sessions", fds0, threads0)

	med := func(d []time.Duration) time.Duration { d = slices.Clone(d); slices.Sort(d); return d[len(d)/2] }
	ratio := func(a, b []time.Duration) float64 { return float64(slices.Min(a)) / float64(slices.Min(b)) }
	t.Logf("session create: min %v, median %v, max %v; plain spawn min %v; ratio of minimums %.2f (bound %d)",
		slices.Min(create), med(create), slices.Max(create), slices.Min(plainC), ratio(create, plainC), costCreateVsSpawnMax)
	t.Logf("launch /bin/true through the boundary (own run cgroup): min %v, median %v; plain spawn min %v, median %v; ratio of minimums %.2f (bound %d)",
		slices.Min(launch), med(launch), slices.Min(plainL), med(plainL), ratio(launch, plainL), costLaunchVsSpawnMax)
	if r := ratio(create, plainC); r > costCreateVsSpawnMax {
		t.Errorf("session create costs %.1f plain spawns (fastest of %d each), bound %d", r, n, costCreateVsSpawnMax)
	}
	if r := ratio(launch, plainL); r > costLaunchVsSpawnMax {
		t.Errorf("a launch costs %.1f plain spawns (fastest of %d each), bound %d", r, n, costLaunchVsSpawnMax)
	}
}

// statusNumber is a number field of /proc/PID/status ("VmRSS", "Threads"),
// without its unit.
func statusNumber(t *testing.T, pid int, key string) int {
	t.Helper()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				if n, err := strconv.Atoi(f[0]); err == nil {
					return n
				}
			}
		}
	}
	t.Fatalf("/proc/%d/status: no %s", pid, key)
	return 0
}

// cgroupTree counts the processes in dir and its descendants, and the
// cgroups (dir included).
func cgroupTree(t *testing.T, dir string) (procs, cgroups int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		cgroups++
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		procs += len(strings.Fields(string(b)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return procs, cgroups
}
