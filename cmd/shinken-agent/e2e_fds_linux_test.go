package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAgentInheritedDescriptors: what the agent's parent leaves open
// without close-on-exec (here a directory descriptor of the host's root,
// from which openat leaves any mount view, and a pipe) is marked
// close-on-exec at start: no session holder (catatonit) and no session
// process holds it.
func TestAgentInheritedDescriptors(t *testing.T) {
	e := newEnv(t)
	root, err := os.Open("/")
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	pipe, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", pw.Fd()))
	e.inherit = []*os.File{root, pw} // fds 3 and 4 of the agent, not close-on-exec
	e.startAgent()
	agent := e.agent.Process.Pid
	for _, fd := range []int{3, 4} {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", agent, fd))
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", agent, fd))
		if err != nil {
			t.Fatalf("agent fd %d: %v", fd, err)
		}
		var flags uint64
		for _, l := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				flags, _ = strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			}
		}
		if flags&unix.O_CLOEXEC == 0 {
			t.Errorf("the agent's inherited fd %d (%s) is not close-on-exec: flags %#o", fd, target, flags)
		}
	}

	e.mustCtl("session", "create", "fds", "-image", "e2e")
	// The session process: 0, 1, 2 (and ls's own, reading the list).
	out := e.mustCtl("run", "fds", "--", "ls", "-l", "/proc/self/fd/")
	var got []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[len(f)-2] != "->" {
			continue
		}
		if t := f[len(f)-1]; strings.HasPrefix(t, "/proc/") && strings.HasSuffix(t, "/fd") {
			continue
		}
		got = append(got, f[len(f)-3])
	}
	if slices.Sort(got); !slices.Equal(got, []string{"0", "1", "2"}) {
		t.Errorf("the session process holds %v, want [0 1 2]:\n%s", got, out)
	}
	// The session's holder (catatonit, pid 1 of its PID namespace) holds
	// neither.
	procs, err := os.ReadFile(filepath.Join(e.cgroupDir, "fds", "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	holders := 0
	for _, p := range strings.Fields(string(procs)) {
		comm, _ := os.ReadFile("/proc/" + p + "/comm")
		if strings.TrimSpace(string(comm)) != "catatonit" {
			continue
		}
		holders++
		fds, _ := os.ReadDir("/proc/" + p + "/fd")
		for _, f := range fds {
			target, _ := os.Readlink("/proc/" + p + "/fd/" + f.Name())
			if target == "/" || target == pipe {
				t.Errorf("the session holder %s holds fd %s: %s (the agent's inherited)", p, f.Name(), target)
			}
		}
	}
	if holders != 1 {
		t.Errorf("%d session holders in %s (%q)", holders, filepath.Join(e.cgroupDir, "fds"), procs)
	}
}
