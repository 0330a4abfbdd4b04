package dataplane

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
	"golang.org/x/sys/unix"
)

// These tests run on a fake cgroup tree in a temporary directory: they check
// which files the cgroup code reads and writes without touching a real
// hierarchy (on this project's hybrid hosts cgroup2 has no controllers, so the
// writing path cannot run on the real one).

func TestCgroup2MountFromMountinfo(t *testing.T) {
	const hybrid = `22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
25 22 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
40 25 0:40 / /sys/fs/cgroup/second rw,relatime - cgroup2 cgroup2 rw
`
	got, err := cgroup2MountFrom(strings.NewReader(hybrid))
	if err != nil || got != "/sys/fs/cgroup/unified" {
		t.Fatalf("hybrid: %q, %v; want the first cgroup2 mount, /sys/fs/cgroup/unified", got, err)
	}
	const spaced = "30 25 0:30 / /mnt/my\\040cgroup rw shared:3 master:1 - cgroup2 none rw\n"
	if got, err := cgroup2MountFrom(strings.NewReader(spaced)); err != nil || got != "/mnt/my cgroup" {
		t.Fatalf("escaped mount point: %q, %v; want %q", got, err, "/mnt/my cgroup")
	}
	const v1only = "27 25 0:25 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory\n"
	if _, err := cgroup2MountFrom(strings.NewReader(v1only)); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("no cgroup2 mount: err %v, want ErrNotSupported", err)
	}
	root, err := FindCgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		t.Fatalf("FindCgroup2Mount = %s, which is not a cgroup2 root: %v", root, err)
	}
}

// fakeCgroupTree makes root/{cgroup.controllers,cgroup.subtree_control} and
// the same two files in root/parent and root/parent/sess, and a Dataplane
// whose one session lives at root/parent/sess.
func fakeCgroupTree(t *testing.T, controllers string) (*Dataplane, string) {
	t.Helper()
	root := t.TempDir()
	sess := filepath.Join(root, "parent", "sess")
	if err := os.MkdirAll(sess, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, filepath.Join(root, "parent"), sess} {
		for _, f := range []string{"cgroup.controllers", "cgroup.subtree_control"} {
			data := ""
			if f == "cgroup.controllers" {
				data = controllers
			}
			if err := os.WriteFile(filepath.Join(dir, f), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	d := &Dataplane{
		cfg:      Config{CgroupRoot: root, Parent: "parent"},
		parent:   filepath.Join(root, "parent"),
		sessions: map[string]*Session{"sess": {Name: "sess", Path: sess}},
	}
	return d, root
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestLimitsUnsupportedWithoutControllers(t *testing.T) {
	d, root := fakeCgroupTree(t, "cpuset io") // a hybrid host: no cpu, memory or pids on cgroup2
	l := Limits{MemoryBytes: 1 << 28, Pids: 64}
	if err := d.CheckLimits(l); !errors.Is(err, ErrLimitsUnsupported) {
		t.Fatalf("CheckLimits without the controllers: %v, want ErrLimitsUnsupported", err)
	} else if !strings.Contains(err.Error(), "memory, pids") {
		t.Errorf("the error does not name the missing controllers: %v", err)
	}
	if err := d.setLimits("sess", l); !errors.Is(err, ErrLimitsUnsupported) {
		t.Fatalf("SetLimits without the controllers: %v, want ErrLimitsUnsupported", err)
	}
	for _, dir := range []string{root, filepath.Join(root, "parent")} {
		if got := readTrim(t, filepath.Join(dir, "cgroup.subtree_control")); got != "" {
			t.Errorf("%s/cgroup.subtree_control was written (%q) although the limits are unsupported", dir, got)
		}
	}
	for _, f := range []string{"memory.max", "pids.max", "cpu.max"} {
		if _, err := os.Stat(filepath.Join(root, "parent", "sess", f)); err == nil {
			t.Errorf("%s was written although the limits are unsupported", f)
		}
	}
	if err := d.CheckLimits(Limits{}); err != nil {
		t.Errorf("no quota is always enforceable: %v", err)
	}
	if err := d.CheckLimits(Limits{CPUPercent: 100*1024 + 1}); !errors.Is(err, ErrInvalidSession) {
		t.Errorf("cpu_percent over 102400: %v, want ErrInvalidSession", err)
	}
	// No cgroup.controllers at all (not a cgroup2 root): unsupported.
	os.Remove(filepath.Join(root, "cgroup.controllers"))
	if err := d.CheckLimits(Limits{Pids: 1}); !errors.Is(err, ErrLimitsUnsupported) {
		t.Errorf("unreadable cgroup.controllers: %v, want ErrLimitsUnsupported", err)
	}
}

func TestSetLimitsWritesQuotas(t *testing.T) {
	d, root := fakeCgroupTree(t, "cpuset cpu io memory pids")
	if err := d.setLimits("sess", Limits{MemoryBytes: 268435456, Pids: 64, CPUPercent: 150}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, filepath.Join(root, "parent")} {
		got := strings.Fields(readTrim(t, filepath.Join(dir, "cgroup.subtree_control")))
		sort.Strings(got)
		if strings.Join(got, " ") != "+cpu +memory +pids" {
			t.Errorf("%s/cgroup.subtree_control enables %q, want +cpu +memory +pids", dir, got)
		}
	}
	if got := readTrim(t, filepath.Join(root, "parent", "sess", "cgroup.subtree_control")); got != "" {
		t.Errorf("the session's own subtree_control was written: %q", got)
	}
	sess := filepath.Join(root, "parent", "sess")
	for f, want := range map[string]string{"memory.max": "268435456", "pids.max": "64", "cpu.max": "150000 100000"} {
		if got := readTrim(t, filepath.Join(sess, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}

	// Only the quotas set are written, and only their controllers enabled.
	d, root = fakeCgroupTree(t, "cpu memory pids")
	if err := d.setLimits("sess", Limits{Pids: 10}); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(root, "cgroup.subtree_control")); got != "+pids" {
		t.Errorf("subtree_control = %q, want +pids", got)
	}
	for _, f := range []string{"memory.max", "cpu.max"} {
		if _, err := os.Stat(filepath.Join(root, "parent", "sess", f)); err == nil {
			t.Errorf("%s written for a pids-only quota", f)
		}
	}
	if err := d.setLimits("nosuch", Limits{Pids: 10}); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("unknown session: %v, want ErrSessionNotFound", err)
	}
}

// TestKillCgroup: killCgroup kills what runs in a cgroup (cgroup.kill) and
// removes it; a cgroup that is already gone is no error. The cgroup is this
// test's own, below the cgroup2 root.
func TestKillCgroup(t *testing.T) {
	kerneltest.RequireRoot(t)
	root, err := FindCgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(root, kerneltest.Name("shinken-test-kill-"))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Rmdir(cg) })
	p := probe.Start(t, func(cmd *exec.Cmd) error {
		fd, err := unix.Open(cg, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		return cmd.Start()
	})
	if got := p.Do("pid"); !strings.HasPrefix(got, "ok ") {
		t.Fatalf("probe: %s", got)
	}
	if err := killCgroup(root, cg); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the probe ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		p.Cmd.Process.Kill()
		t.Fatal("the process in the cgroup was not killed")
	}
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s still there: %v", cg, err)
	}
	if err := killCgroup(root, cg); err != nil {
		t.Errorf("killCgroup of a removed cgroup: %v", err)
	}
}
