//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/connrounds"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"golang.org/x/sys/unix"
)

// The session boundary in the bench: the dataplane runs with it (every
// session has its uid, namespaces and holder, as in the daemon), and the
// workers of the bench's sessions start through the launcher (dp.Launch:
// uid, no capabilities, no_new_privs, Landlock scoping, the seccomp filter),
// so every figure includes the boundary's per-syscall cost.

// spinEnv makes this binary a getppid loop (spinMain): the seccomp cost.
const spinEnv = "SHINKEN_BENCH_SPIN"

// boundaryConfig: the launcher binary next to this one (make bench-egress
// builds it into bin/), else this binary re-executed (it calls
// boundary.Main), as the report line says.
func boundaryConfig() *boundary.Config {
	return &boundary.Config{}
}

// start starts cmd in s: through the launcher when s is one of the
// dataplane's sessions, else (a plain cgroup: the nftables contender) as
// before, with StartIn (nobody, no boundary).
func (b *bench) start(s dataplane.Session, cmd *exec.Cmd) error {
	if cur, err := b.dp.Session(s.Name); err == nil && cur.CgroupID == s.CgroupID && s.Name != "" {
		return b.dp.Launch(s.Name, cmd, dataplane.ProcOptions{})
	}
	return dataplane.StartIn(s, cmd, dataplane.ProcOptions{})
}

// spinMain: N getppid calls in a tight loop on one thread; prints the
// nanoseconds per call.
func spinMain() {
	n, _ := strconv.Atoi(os.Getenv(spinEnv))
	t0 := time.Now()
	for i := 0; i < n; i++ {
		unix.Getppid()
	}
	fmt.Printf("%.2f\n", float64(time.Since(t0).Nanoseconds())/float64(n))
	os.Exit(0)
}

// seccompCost runs the getppid loop in a process launched in session s
// (filter, Landlock, uid) and in the same binary started unconfined (in the
// bench's own cgroup), in interleaved rounds; it returns the median of the
// per-round differences (ns per syscall) and both medians.
func (b *bench) seccompCost(s dataplane.Session, rounds int) (diff, confined, plain float64, err error) {
	const n = 2_000_000
	one := func(launch bool) (float64, error) {
		cmd := exec.Command(filepath.Join(b.probeDir, "probe"))
		cmd.Env = []string{spinEnv + "=" + strconv.Itoa(n)}
		cmd.Dir = "/"
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if launch {
			err = b.dp.Launch(s.Name, cmd, dataplane.ProcOptions{})
		} else {
			err = cmd.Start()
		}
		if err != nil {
			return 0, err
		}
		if err := cmd.Wait(); err != nil {
			return 0, fmt.Errorf("getppid loop: %v: %s", err, out.String())
		}
		return strconv.ParseFloat(strings.TrimSpace(out.String()), 64)
	}
	var d, c, p []float64
	for r := 0; r < rounds; r++ {
		order := []bool{r%2 == 0, r%2 != 0}
		var got [2]float64
		for _, launch := range order {
			v, err := one(launch)
			if err != nil {
				return 0, 0, 0, err
			}
			got[map[bool]int{true: 0, false: 1}[launch]] = v
		}
		c, p, d = append(c, got[0]), append(p, got[1]), append(d, got[0]-got[1])
	}
	return connrounds.Median(d), connrounds.Median(c), connrounds.Median(p), nil
}
