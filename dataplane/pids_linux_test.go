package dataplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// forkLoopEnv names the mode in which the test binary forks up to 100
// children that pause (raw fork: each child is one task) and prints how
// many started and the first error, then kills them.
const forkLoopEnv = "SHINKEN_TEST_FORK_LOOP"

func forkLoopMain() {
	var kids []int
	var first error
	for i := 0; i < 100; i++ {
		pid, _, e := unix.RawSyscall(unix.SYS_FORK, 0, 0, 0)
		if e != 0 {
			if first == nil {
				first = e
			}
			continue
		}
		if pid == 0 {
			for {
				unix.RawSyscall(unix.SYS_PAUSE, 0, 0, 0)
			}
		}
		kids = append(kids, int(pid))
	}
	fmt.Printf("%d %v\n", len(kids), first)
	for _, p := range kids {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	os.Exit(0)
}

// TestPidsMaxForkLoop: where the pids controller is on cgroup v2 (the VM
// of .ci/vmtest; not this host, whose pids controller is on cgroup v1 and
// is never written), a session's pids.max stops a fork loop at its bound
// (EAGAIN) while another session still starts all its processes.
func TestPidsMaxForkLoop(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	if err := d.CheckLimits(Limits{Pids: 32}); errors.Is(err, ErrLimitsUnsupported) {
		t.Skipf("unavailable: pids on cgroup v1 here (%v)", err)
	}
	bounded, err := d.CreateSession("pids-bounded", Limits{Pids: 32})
	if err != nil {
		t.Fatal(err)
	}
	free, err := d.CreateSession("pids-free", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	loop := func(s Session) (int, string) {
		t.Helper()
		cmd := exec.Command("/proc/self/exe")
		cmd.Env = append(os.Environ(), forkLoopEnv+"=1")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := StartIn(s, cmd, ProcOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("fork loop in %s: %v: %s", s.Name, err, out.String())
		}
		f := strings.Fields(out.String())
		if len(f) < 2 {
			t.Fatalf("fork loop in %s: %q", s.Name, out.String())
		}
		n, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatalf("fork loop in %s: %q", s.Name, out.String())
		}
		return n, strings.Join(f[1:], " ")
	}
	n, why := loop(bounded)
	if n >= 32 || n == 0 || !strings.Contains(why, "resource temporarily unavailable") {
		t.Errorf("under pids.max 32: %d of 100 forks started (first error %s), want fewer than 32, some, and EAGAIN", n, why)
	}
	m, why2 := loop(free)
	if m != 100 {
		t.Errorf("the other session started %d of 100 (%s)", m, why2)
	}
	t.Logf("pids.max 32: %d of 100 forks started (the loop's own threads count), then %s; the other session: %d", n, why, m)
}
