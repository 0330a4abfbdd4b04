package boundary

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

// launchABEnv: TestLaunchTime runs with this many launches (issue 20's
// A/B of the launch path; bench/README.md). Not a benchmark of record:
// the bench-agent figures are.
const launchABEnv = "SHINKEN_LAUNCH_AB"

// TestLaunchTime times Launch of /bin/echo in one session with the Landlock
// baseline (a credential location beside the tree), from the call to the
// first byte of the echo's output, and prints the times in ms, one launch a
// line with the launched process's CPU time (user + system: the
// launcher's and the echo's) beside it, to the file named by
// SHINKEN_LAUNCH_AB_OUT (for an A/B of two builds, alternated by the
// caller).
func TestLaunchTime(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(launchABEnv))
	if n <= 0 {
		t.Skip(launchABEnv + " not set")
	}
	b := newBoundary(t, Config{FileNever: []string{"/etc/shadow", "/etc/gshadow", "/root"}}, nil)
	// With SHINKEN_LAUNCH_AB_FRESH set, each launch is its session's first
	// (a new session each time: the bench-agent's exec phase spreads its
	// launches over the sessions so).
	fresh := os.Getenv(launchABEnv+"_FRESH") != ""
	name := "lt"
	session(t, b, name, 72)
	var ms, cpu []float64
	buf := make([]byte, 1)
	for i := 0; i < n+1; i++ {
		if fresh && i > 0 {
			name = fmt.Sprintf("lt%d", i)
			session(t, b, name, uint32(100+i))
		}
		cmd := &exec.Cmd{Path: "/bin/echo", Args: []string{"echo", "x"}, Dir: "/", Env: []string{}}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout = w
		t0 := time.Now()
		if err := b.Launch(name, cmd, LaunchOptions{}, false); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
		d := time.Since(t0)
		r.Close()
		cmd.Wait()
		if i > 0 { // the first launch builds what later ones reuse
			ms = append(ms, float64(d.Microseconds())/1000)
			// The launcher's and the echo's CPU time (one process).
			c := cmd.ProcessState.SystemTime() + cmd.ProcessState.UserTime()
			cpu = append(cpu, float64(c.Microseconds())/1000)
		}
	}
	var out []byte
	for i, m := range ms {
		out = fmt.Appendf(out, "%.3f %.3f\n", m, cpu[i])
	}
	if f := os.Getenv(launchABEnv + "_OUT"); f != "" {
		os.WriteFile(f, out, 0o644)
	}
	slices.Sort(ms)
	t.Logf("%d launches: median %.3f ms, p90 %.3f", len(ms), ms[len(ms)/2], ms[len(ms)*9/10])
}
