//go:build linux

package main

import (
	"fmt"
	"log"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/dataplane"
)

// cgroupRoot is the cgroup2 mount (set by newEgress).
var cgroupRoot string

// holderHeadroom: the holders (and the namespaces of each) the run may make
// beside the host's own: the worker's session, and slack.
const holderHeadroom = 4096

// saved is a sysctl's value before the run raised it.
type saved struct{ path, value string }

// raiseSysctls raises the host's ceilings that the run would pass (whatever its session count). A session
// holds a process and namespaces only from its first launch (its holder,
// pid 1 of its PID namespace, with a mount, PID, IPC and cgroup namespace
// counted against user.max_*_namespaces of the initial user namespace), and
// the run launches into none of the daemon's n sessions: the worker's own
// session is the one holder it makes (egress.go). So n sessions need no
// more processes or namespaces than holderHeadroom covers; the run fails at
// that launch, with the kernel's error, if a session were launched into
// past it. It raises only what is below the need and returns what it
// changed, for restoreSysctls; on an error it has restored them already.
func raiseSysctls() ([]saved, error) {
	procs := benchkit.CountProcs()
	need := map[string]int{
		"kernel/pid_max":             min(procs+holderHeadroom+8192, 1<<22), // PID_MAX_LIMIT
		"kernel/threads-max":         threadsNow() + holderHeadroom + 8192,
		"user/max_mnt_namespaces":    holderHeadroom,
		"user/max_pid_namespaces":    holderHeadroom,
		"user/max_ipc_namespaces":    holderHeadroom,
		"user/max_cgroup_namespaces": holderHeadroom,
	}
	var done []saved
	keys := make([]string, 0, len(need))
	for k := range need {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		path := "/proc/sys/" + k
		cur, err := strconv.Atoi(benchkit.ReadTrim(path))
		if err != nil {
			restoreSysctls(done)
			return nil, fmt.Errorf("read %s: %v", path, err)
		}
		if cur >= need[k] {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(need[k])), 0); err != nil {
			restoreSysctls(done)
			return nil, fmt.Errorf("raise %s from %d to %d: %w", path, cur, need[k], err)
		}
		done = append(done, saved{path, strconv.Itoa(cur)})
		fmt.Printf("sysctl %s: %d -> %d for the run (restored at its end)\n", strings.ReplaceAll(k, "/", "."), cur, need[k])
	}
	return done, nil
}

func restoreSysctls(s []saved) {
	for i := len(s) - 1; i >= 0; i-- {
		if err := os.WriteFile(s[i].path, []byte(s[i].value), 0); err != nil {
			log.Printf("restore %s to %s: %v", s[i].path, s[i].value, err)
		}
	}
}

func threadsNow() int {
	f := strings.Fields(benchkit.ReadTrim("/proc/loadavg")) // "... running/total pid"
	if len(f) >= 4 {
		if _, total, ok := strings.Cut(f[3], "/"); ok {
			n, _ := strconv.Atoi(total)
			return n
		}
	}
	return 0
}

func findCgroupRoot() (string, error) {
	if cgroupRoot == "" {
		r, err := dataplane.FindCgroup2Mount()
		if err != nil {
			return "", err
		}
		cgroupRoot = r
	}
	return cgroupRoot, nil
}

func sortFloats(v []float64) { sort.Float64s(v) }
