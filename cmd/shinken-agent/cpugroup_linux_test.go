//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// autogroupOf is readAutogroup's answer for pid, which must read.
func autogroupOf(t *testing.T, pid string) (string, int) {
	t.Helper()
	g, n, err := readAutogroup(pid)
	if err != nil {
		t.Fatal(err)
	}
	return g, n
}

// TestCPUGroup: an agent that does not lead its session leaves its
// starter's autogroup as it was and says why; one that does (as a service
// manager starts it) gives its autogroup nice -10. Nothing a session runs
// shares that group, a session cannot give its own group more weight, and
// no other uid can take the agent's away. Where this host schedules the
// agent outside autogroups, status must say so instead.
func TestCPUGroup(t *testing.T) {
	e := newEnv(t)
	status := func() string { return e.statusString("agent_cpu_group") }
	unavailable := ""
	if b, _ := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); strings.TrimSpace(string(b)) != "1" {
		unavailable = "kernel.sched_autogroup_enabled is 0"
	} else if tg, err := cpuTaskGroup(); err != nil || tg != "/" {
		unavailable = "where autogroups do not apply"
	}
	mine, myNice := autogroupOf(t, "self")

	e.startAgent()
	got := status()
	if unavailable != "" {
		if !strings.Contains(got, unavailable) {
			t.Fatalf("agent_cpu_group %q, want it to say %q", got, unavailable)
		}
		return
	}
	if !strings.Contains(got, "not raised: the agent does not lead its session") {
		t.Errorf("agent_cpu_group of an agent in its starter's session: %q", got)
	}
	if g, n := autogroupOf(t, fmt.Sprint(e.agent.Process.Pid)); g != mine || n != myNice {
		t.Errorf("agent in %s nice %d, want its starter's %s nice %d, untouched", g, n, mine, myNice)
	}
	e.stopAgent(syscall.SIGTERM)

	e.setsid = true
	e.startAgent()
	pid := fmt.Sprint(e.agent.Process.Pid)
	agentGroup, n := autogroupOf(t, pid)
	if n != -10 || agentGroup == mine {
		t.Errorf("agent leading its session: %s nice %d, want a group of its own at nice -10", agentGroup, n)
	}
	if got := status(); !strings.Contains(got, agentGroup+", nice -10 (weight 9548") {
		t.Errorf("agent_cpu_group %q", got)
	}
	if g, n := autogroupOf(t, "self"); g != mine || n != myNice {
		t.Errorf("the test's own group became %s nice %d", g, n)
	}

	// What a session runs is in groups of its own, at nice 0, and cannot
	// lower that nice (it has no CAP_SYS_NICE).
	e.mustCtl("session", "create", "cg", "-image", "e2e")
	out := e.mustCtl("run", "cg", "--", "sh", "-c", "cat /proc/self/autogroup; echo -10 > /proc/self/autogroup && echo LOWERED; cat /proc/self/autogroup")
	t.Logf("agent %s run:\n%s", agentGroup, out)
	if strings.Contains(out, agentGroup+" ") || strings.Contains(out, "LOWERED") || !strings.Contains(out, "nice 0") {
		t.Errorf("a session's run:\n%s", out)
	}
	// Another uid cannot write the agent's group.
	w := exec.Command("sh", "-c", "echo 19 > /proc/"+pid+"/autogroup")
	w.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	if out, err := w.CombinedOutput(); err == nil {
		t.Errorf("uid 65534 wrote the agent's autogroup: %s", out)
	}
	if _, n := autogroupOf(t, pid); n != -10 {
		t.Errorf("the agent's group is at nice %d after another uid's write", n)
	}
}

// TestCPUGroupConfig: agent_autogroup_nice takes -20 to 19 and refuses
// anything else with its name; 0 writes nothing and says so.
func TestCPUGroupConfig(t *testing.T) {
	cfg, _, err := load([]string{"-config", ""})
	if err != nil || cfg.AgentAutogroupNice != -10 {
		t.Errorf("default: %d, %v", cfg.AgentAutogroupNice, err)
	}
	for _, ok := range []string{"-20", "0", "19"} {
		if _, _, err := load([]string{"-config", "", "-autogroup-nice", ok}); err != nil {
			t.Errorf("-autogroup-nice %s: %v", ok, err)
		}
	}
	for _, bad := range []string{"-21", "20"} {
		if _, _, err := load([]string{"-config", "", "-autogroup-nice", bad}); err == nil || !strings.Contains(err.Error(), "agent_autogroup_nice") {
			t.Errorf("-autogroup-nice %s: err %v", bad, err)
		}
	}
	if g := newCPUGroup(0); !strings.Contains(g.fact(), "agent_autogroup_nice 0") {
		t.Errorf("0: %q", g.fact())
	}
}

// TestCPUTaskGroupOf: the cpu cgroup is a v1 hierarchy's with the cpu
// controller, else the cgroup2 path where cpu is enabled, else the root.
func TestCPUTaskGroupOf(t *testing.T) {
	ctrl := func(c ...string) func(string) ([]string, error) {
		return func(string) ([]string, error) { return c, nil }
	}
	for _, c := range []struct {
		text string
		ctrl func(string) ([]string, error)
		want string
	}{
		{"9:name=systemd:/\n2:cpu,cpuacct:/\n0::/x\n", ctrl("cpu"), "/"},
		{"2:cpu,cpuacct:/docker/abc\n0::/\n", ctrl(), "/docker/abc"},
		{"0::/system.slice/shinken-agent.service\n", ctrl("cpu", "memory"), "/system.slice/shinken-agent.service"},
		{"0::/system.slice/shinken-agent.service\n", ctrl("memory", "pids"), "/"},
		{"0::/\n", ctrl("cpu"), "/"},
		{"1:cpuset:/a\n0::/\n", ctrl(), "/"},
	} {
		if got, err := cpuTaskGroupOf(c.text, c.ctrl); err != nil || got != c.want {
			t.Errorf("%q: %q, %v; want %q", c.text, got, err, c.want)
		}
	}
	if _, err := cpuTaskGroupOf("garbage-without-colons-but:one\n", ctrl()); err == nil {
		t.Errorf("a malformed line was taken")
	}
}
