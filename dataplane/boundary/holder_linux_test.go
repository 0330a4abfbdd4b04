package boundary

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

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
			}
			if grew := countFDs(t) - before; grew >= n {
				t.Errorf("%d sessions: the agent holds %d more descriptors", n, grew)
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
			h := &holder{pid: os.Getpid(), child: true, pidfd: -1, gone: true}
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
