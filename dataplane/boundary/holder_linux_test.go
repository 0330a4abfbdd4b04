package boundary

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// TestHolderNoDescriptors: the agent keeps no descriptor per holder it
// started (every fork would copy them all), a launch still joins the
// session, and a launch after Release is refused (the holder's pid may be
// reaped and reused by then). Both ways of making holders.
func TestHolderNoDescriptors(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			b := newBoundary(t, Config{}, nil)
			if direct && !b.directInit {
				t.Skip("this kernel's proc has no pidns option: holders come from the init mode")
			}
			b.directInit = direct
			before := countFDs(t)
			const n = 20
			for i := 0; i < n; i++ {
				session(t, b, fmt.Sprintf("fd%d", i), uint32(40+i))
				startHolderIn(t, b, fmt.Sprintf("fd%d", i)) // lazy start (issue 21)
			}
			// Less the sessions' prebuilt Landlock rulesets (at most
			// maxRulesets: TestRulesetPrebuildNoChurn).
			waitPrebuilt(t, b, 0)
			b.rulesets.mu.Lock()
			cached := len(b.rulesets.sets)
			b.rulesets.mu.Unlock()
			if grew := countFDs(t) - before - cached; grew >= n {
				t.Errorf("%d sessions: the agent holds %d more descriptors (and %d cached rulesets)", n, grew, cached)
			}
			out := runIn(t, b, "fd3", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/1/comm; ls /proc | grep -c '^[0-9]'"}, Dir: "/"}, true)
			if f := strings.Fields(out); len(f) != 2 || f[0] != "catatonit" {
				t.Errorf("inside the session: pid 1 and process count %q, want catatonit", out)
			}
			b.Release("fd3")
			err := b.Launch("fd3", &exec.Cmd{Path: "/bin/true", Args: []string{"true"}}, LaunchOptions{}, true)
			if err == nil {
				t.Fatal("launch after release: want an error")
			}
			h := &holder{pid: os.Getpid(), child: true, gone: true}
			if _, err := h.open(); !errors.Is(err, unix.ESRCH) {
				t.Errorf("open of a released holder: %v, want ESRCH", err)
			}
		})
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestAdoptNoDescriptors: a restarted agent that adopts sessions keeps no
// descriptor per holder either; a launch into an adopted session still
// joins it, a holder that is not the session's (a pid that is no longer
// it) is refused, and Release kills the adopted holder.
func TestAdoptNoDescriptors(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	const n = 20
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = session(t, b, fmt.Sprintf("ad%d", i), uint32(70+i))
		startHolderIn(t, b, fmt.Sprintf("ad%d", i)) // lazy start (issue 21)
	}
	b2 := newBoundary(t, Config{}, nil) // the restarted agent
	before := countFDs(t)
	for i, dir := range dirs {
		if err := b2.Adopt(fmt.Sprintf("ad%d", i), dir, uint32(70+i)); err != nil {
			t.Fatal(err)
		}
	}
	if grew := countFDs(t) - before; grew >= n {
		t.Errorf("%d adopted sessions: the agent holds %d more descriptors", n, grew)
	}
	out := runIn(t, b2, "ad4", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/1/comm"}, Dir: "/"}, true)
	if strings.TrimSpace(out) != "catatonit" {
		t.Errorf("inside an adopted session: pid 1 is %q, want catatonit", out)
	}
	b2.mu.Lock()
	h := b2.holders["ad4"]
	b2.mu.Unlock()
	// The holder's pid, but named under another session's cgroup: refused.
	if fd, err := openHolder(dirs[5], h.pid); err == nil {
		unix.Close(fd)
		t.Errorf("holder %d accepted as the holder of another session", h.pid)
	}
	// This process is in no session and is no PID namespace's pid 1.
	if fd, err := openHolder(dirs[4], os.Getpid()); err == nil {
		unix.Close(fd)
		t.Errorf("the test process accepted as a holder")
	}
	b2.Release("ad4")
	// Killed (SIGKILL is delivered when it next runs); its parent here is
	// b, in this process, which has not reaped it: a zombie, or gone.
	dead := false
	for i := 0; i < 200 && !dead; i++ {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.pid))
		dead = err != nil || strings.Contains(string(st), ") Z ")
		if !dead {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !dead {
		t.Errorf("the adopted holder %d is alive 2 s after Release", h.pid)
	}
	if err := b2.Launch("ad4", &exec.Cmd{Path: "/bin/true", Args: []string{"true"}}, LaunchOptions{}, true); err == nil {
		t.Error("launch after release: want an error")
	}
}

// TestHolderStartFails: a holder whose catatonit cannot start (made
// directly: its two threads, holderFromThreads) fails the launch with why,
// leaves no process in the session and no thread behind, and the next
// launch starts it; the started holder's standard descriptors are
// /dev/null and its session user is named in its view.
func TestHolderStartFails(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	if !b.directInit {
		t.Skip("this kernel's proc has no pidns option: holders come from the init mode")
	}
	dir := session(t, b, "hsf", 95)
	catatonit := b.cfg.Catatonit
	b.cfg.Catatonit = filepath.Join(t.TempDir(), "no-catatonit")
	threads := func() int {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := threads()
	for i := 0; i < 20; i++ {
		err := b.Launch("hsf", &exec.Cmd{Path: "/bin/true", Args: []string{"true"}}, LaunchOptions{}, true)
		if err == nil || !strings.Contains(err.Error(), "session init") || !strings.Contains(err.Error(), "no-catatonit") {
			t.Fatalf("launch with no catatonit: %v, want the session init's error naming it", err)
		}
	}
	if p := cgroupProcs(t, dir); len(p) != 0 {
		t.Errorf("after failed starts: processes %v in the session cgroup", p)
	}
	if run, _ := b.HolderRunning("hsf"); run {
		t.Error("after failed starts: holder running")
	}
	// Each start's two threads end with it; the runtime may keep a few idle.
	if grew := threads() - before; grew >= 20 {
		t.Errorf("20 failed starts left %d more threads", grew)
	}
	b.cfg.Catatonit = catatonit
	out := runIn(t, b, "hsf", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/1/comm; id -un; stat -f -c %T /tmp"}, Dir: "/"}, true)
	if f := strings.Fields(out); len(f) != 3 || f[0] != "catatonit" || f[1] != backend.SessionUser || f[2] != "tmpfs" {
		t.Errorf("inside the session after the failures: %q, want catatonit, %s and tmpfs", out, backend.SessionUser)
	}
	b.mu.Lock()
	pid := b.holders["hsf"].pid
	b.mu.Unlock()
	var null unix.Stat_t
	if err := unix.Stat(os.DevNull, &null); err != nil {
		t.Fatal(err)
	}
	for fd := 0; fd < 3; fd++ {
		var st unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), &st); err != nil || st.Rdev != null.Rdev || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			t.Errorf("catatonit's descriptor %d: rdev %#x mode %o (%v), want /dev/null", fd, st.Rdev, st.Mode, err)
		}
	}
}
