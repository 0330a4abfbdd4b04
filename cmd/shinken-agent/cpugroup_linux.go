package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// The agent's CPU group (issue 23, fair sharing). Every session's DNS
// answers, grants and process I/O go through the agent, so a session that
// keeps the CPUs busy delays every other session by delaying the agent.
// Where the cpu controller is on cgroup v1 (this project's hybrid hosts)
// the agent may not weight anything by cgroup, and every task there is in
// the root task group, where the scheduler shares the CPU between
// autogroups: one per session (setsid). A session's processes are in
// autogroups of their own (the launcher, the shims and the holders all
// call setsid), each weighing what nice 0 weighs; the agent's autogroup
// is given the weight of agent_autogroup_nice (default -10: 9,548 against
// 1,024, about 9×), so that under a session's flood the agent's threads
// get a CPU soon and often enough to keep answering the others.
//
// The weight is the autogroup's, so it is written only when the agent
// leads its own session (a service manager starts it so, as systemd does
// and runc does for a container's first process): otherwise the group is
// its starter's (a shell's, a test's) and would be raised with it. A
// process may raise its own autogroup's nice but lower it only with
// CAP_SYS_NICE, and only root may write the agent's (its /proc files are
// root's), so no session can take the weight away or give itself as much;
// a session can make more autogroups (each setsid makes one, up to its
// RLIMIT_NPROC), each weighing 1,024 when busy (README, "CPU").

// defaultAutogroupNice is agent_autogroup_nice's default.
const defaultAutogroupNice = -10

type cpuGroup struct {
	err error // why the nice was not written, if it was not
}

// newCPUGroup gives the agent's autogroup nice (0: leaves it as it is).
func newCPUGroup(nice int) *cpuGroup {
	if nice == 0 {
		return &cpuGroup{err: errors.New("left at the kernel's default weight (agent_autogroup_nice 0)")}
	}
	return &cpuGroup{err: raiseAutogroup(nice)}
}

// raiseAutogroup writes nice to the agent's autogroup, where that group
// is the agent's own and weighs anything.
func raiseAutogroup(nice int) error {
	if b, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); err != nil {
		return fmt.Errorf("unavailable: this kernel has no autogroups (%v)", err)
	} else if strings.TrimSpace(string(b)) != "1" {
		return errors.New("unavailable: kernel.sched_autogroup_enabled is 0")
	}
	if tg, err := cpuTaskGroup(); err != nil {
		return fmt.Errorf("unavailable: %w", err)
	} else if tg != "/" {
		return fmt.Errorf("unavailable: the agent is in cpu cgroup %s, where autogroups do not apply (weight the agent there, e.g. CPUWeight= on its unit)", tg)
	}
	if sid, _ := unix.Getsid(0); sid != os.Getpid() {
		return fmt.Errorf("not raised: the agent does not lead its session (session %d, its starter's), so its autogroup is shared with the processes that started it; run it as a service (cmd/shinken-agent/shinken-agent.service) or under setsid(1)", sid)
	}
	if err := os.WriteFile("/proc/self/autogroup", []byte(strconv.Itoa(nice)), 0); err != nil {
		return fmt.Errorf("not raised: %w", err)
	}
	if _, n, err := readAutogroup("self"); err != nil {
		return fmt.Errorf("not raised: %w", err)
	} else if n != nice {
		return fmt.Errorf("not raised: the kernel took nice %d for the agent's autogroup but reads back %d", nice, n)
	}
	return nil
}

// fact is the status line: the agent's autogroup and its nice now, and
// why it was not raised if it was not.
func (g *cpuGroup) fact() string {
	name, n, rerr := readAutogroup("self")
	now := ""
	if rerr == nil {
		now = fmt.Sprintf("%s, nice %d", name, n)
	} else {
		now = rerr.Error()
	}
	if g.err != nil {
		return fmt.Sprintf("%s; %s", now, g.err)
	}
	return fmt.Sprintf("%s (weight %d against a session autogroup's 1024): the agent leads its own session, and every session process is in an autogroup of its own", now, niceWeight(n))
}

// readAutogroup reads /proc/PID/autogroup ("/autogroup-N nice X"; pid
// "self" for the agent's own): the group's name and its nice.
func readAutogroup(pid string) (string, int, error) {
	file := "/proc/" + pid + "/autogroup"
	b, err := os.ReadFile(file)
	if err != nil {
		return "", 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 { // the kernel's default group: a process init started without setsid
		return "no autogroup of its own (the root group)", 0, nil
	}
	if len(f) != 3 || f[1] != "nice" {
		return "", 0, fmt.Errorf("%s: unexpected %q", file, b)
	}
	n, err := strconv.Atoi(f[2])
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", file, err)
	}
	return f[0], n, nil
}

// niceWeight is the scheduler's weight for nice n (sched_prio_to_weight):
// 1024 at 0, about 1.25× per step.
func niceWeight(n int) int {
	w := [...]int{88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
		9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
		1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
		110, 87, 70, 56, 45, 36, 29, 23, 18, 15}
	return w[min(max(n, -20), 19)+20]
}

// cpuTaskGroup is the cpu cgroup the agent's threads are scheduled in
// ("/": the root task group, where autogroups apply).
func cpuTaskGroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	return cpuTaskGroupOf(string(b), func(path string) ([]string, error) {
		// The cgroup2 mount (the daemon reaches the dataplane's own finder
		// only through the backend, agent/backend/imports_test.go).
		ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
		if err != nil {
			return nil, err
		}
		if len(ms) == 0 {
			return nil, errors.New("no cgroup2 mount")
		}
		c, err := os.ReadFile(filepath.Join(ms[0].Mountpoint, path, "cgroup.controllers"))
		return strings.Fields(string(c)), err
	})
}

// cpuTaskGroupOf reads /proc/self/cgroup's text: the path of a v1
// hierarchy that has the cpu controller, else the cgroup2 path if the cpu
// controller is enabled there (controllers lists a cgroup2 path's), else
// "/".
func cpuTaskGroupOf(text string, controllers func(path string) ([]string, error)) (string, error) {
	unified := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		ctrls, path, ok := strings.Cut(rest, ":")
		if !ok {
			return "", fmt.Errorf("/proc/self/cgroup: unexpected line %q", sc.Text())
		}
		if id == "0" && ctrls == "" {
			unified = path
			continue
		}
		if slices.Contains(strings.Split(ctrls, ","), "cpu") {
			return path, nil
		}
	}
	if unified == "" || unified == "/" {
		return "/", nil
	}
	c, err := controllers(unified)
	if err != nil {
		return "", fmt.Errorf("cgroup2 controllers of %s: %w", unified, err)
	}
	if slices.Contains(c, "cpu") {
		return unified, nil
	}
	return "/", nil
}
