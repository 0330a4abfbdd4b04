package boundary

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

const helperEnv = "SHINKEN_BT_HELPER"

// TestMain: the test binary is also the launcher (Main) and the programs the
// tests run inside sessions (helpers, chosen by SHINKEN_BT_HELPER).
func TestMain(m *testing.M) {
	Main()
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode, os.Args[1:]))
	}
	code := m.Run()
	if helperDir != "" {
		os.RemoveAll(helperDir)
	}
	if cgParent != "" {
		removeCgroupTree(cgParent)
	}
	os.Exit(code)
}

var (
	setupOnce sync.Once
	setupErr  error
	helperDir string // under /var/tmp: visible (read-only) inside sessions, unlike /tmp
	helperBin string // copy of this test binary
	launchBin string // the dedicated launcher, built from cmd/shinken-launch
	execBin   string // the C launcher, built from cmd/shinken-exec (beside launchBin)
	cgParent  string // our own test parent under the cgroup2 mount
)

func setup(t *testing.T) {
	t.Helper()
	kerneltest.RequireRoot(t) // a skip without root, a failure under CI
	setupOnce.Do(func() {
		root, err := cgroup2Mount()
		if err != nil {
			setupErr = err
			return
		}
		cgParent = filepath.Join(root, fmt.Sprintf("shinken-boundary-test-%d", os.Getpid()))
		if setupErr = os.Mkdir(cgParent, 0o755); setupErr != nil {
			cgParent = ""
			return
		}
		helperDir, setupErr = os.MkdirTemp("/var/tmp", "shinken-boundary-test-")
		if setupErr != nil {
			return
		}
		if setupErr = os.Chmod(helperDir, 0o777); setupErr != nil {
			return
		}
		self, err := os.Executable()
		if err != nil {
			setupErr = err
			return
		}
		helperBin = filepath.Join(helperDir, "helper")
		if setupErr = copyFile(self, helperBin, 0o755); setupErr != nil {
			return
		}
		launchBin = filepath.Join(helperDir, LauncherName)
		execBin = filepath.Join(helperDir, ExecName)
		if pre := kerneltest.Prebuilt(t, LauncherName); pre != "" {
			// Built beforehand (the VM of .ci/vmtest has no toolchain).
			if setupErr = copyFile(pre, launchBin, 0o755); setupErr == nil {
				setupErr = copyFile(kerneltest.Prebuilt(t, ExecName), execBin, 0o755)
			}
			return
		}
		// Without cgo, as make builds it (and .ci/vmtest).
		build := exec.Command("go", "build", "-o", launchBin, "github.com/shinken-agent/shinken/cmd/shinken-launch")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			setupErr = fmt.Errorf("build the launcher: %v: %s", err, out)
			return
		}
		// The C launcher, as make builds it: every launch of these tests
		// goes through it (TestGoLaunchMode runs the protection tests
		// again through the Go launcher's launch mode).
		if out, err := exec.Command("../../cmd/shinken-exec/build", execBin).CombinedOutput(); err != nil {
			setupErr = fmt.Errorf("build the C launcher: %v: %s", err, out)
		}
	})
	if setupErr != nil {
		t.Fatalf("setup: %v", setupErr)
	}
}

var (
	acceptOnce sync.Once
	accepted   []string // the mechanisms this host lacks that the tests accept
	acceptWhy  string   // their probe reasons
)

// hostAccept returns the weaker levels the tests accept on this host, found
// by the boundary's own probe: only the Landlock IPC scopes (ABI 6), which
// the VM of .ci/vmtest (Linux 6.1: Landlock ABI 2) lacks; sessions are then
// created as an operator who accepts it would have them. A test of what
// the scopes stop skips with the same reason (needScopes). Any other
// mechanism the probe finds missing still fails session creation.
func hostAccept(t testing.TB) []string {
	t.Helper()
	acceptOnce.Do(func() {
		b, err := New(Config{Accept: []string{MechLandlock}, Launcher: launchBin}, 65536)
		if err != nil {
			acceptWhy = "probe: " + err.Error()
			return
		}
		defer b.Close()
		for _, s := range b.Report() {
			if string(s.Class) == MechLandlock && s.Level == backend.Unavailable {
				accepted, acceptWhy = []string{MechLandlock}, s.Reason
			}
		}
	})
	if len(accepted) > 0 {
		t.Logf("accepted on this host: %s (%s)", MechLandlock, acceptWhy)
	}
	return accepted
}

// needScopes skips a test of what the Landlock IPC scopes stop where the
// probe found none (see hostAccept).
func needScopes(t testing.TB) {
	t.Helper()
	hostAccept(t)
	if len(accepted) > 0 {
		t.Skipf("%s: %s", MechLandlock, acceptWhy)
	}
}

// cgroup2Mount is the first cgroup2 mount point of the mount table, read
// with moby/sys/mountinfo (as dataplane.FindCgroup2Mount does).
func cgroup2Mount() (string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		return "", err
	}
	if len(ms) == 0 {
		return "", fmt.Errorf("no cgroup2 mount")
	}
	return ms[0].Mountpoint, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

// removeCgroupTree kills and removes a cgroup directory this test made and
// everything below it.
func removeCgroupTree(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 200; i++ {
		if err := unix.Rmdir(dir); err == nil || err == unix.ENOENT {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newBoundary opens a boundary with the product defaults, then lets the
// test remove protections (to show what each one stops).
func newBoundary(t *testing.T, cfg Config, edit func(*Boundary)) *Boundary {
	t.Helper()
	setup(t)
	if cfg.Launcher == "" {
		cfg.Launcher = launchBin
	}
	if cfg.Exec == "" && os.Getenv(goLaunchEnv) != "" {
		cfg.Exec = filepath.Join(helperDir, "no-c-launcher")
	}
	cfg.Accept = append(cfg.Accept, hostAccept(t)...)
	b, err := New(cfg, 65536)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(b)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// session makes a session cgroup under the test parent and its boundary.
func session(t *testing.T, b *Boundary, name string, index uint32) string {
	t.Helper()
	dir := filepath.Join(cgParent, fmt.Sprintf("%s-%d", name, index))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		b.Release(name)
		removeCgroupTree(dir)
	})
	if err := b.Create(name, dir, index); err != nil {
		t.Fatalf("create session %s: %v", name, err)
	}
	return dir
}

// helper returns a command running this test binary's helper mode inside a
// session (not yet started).
func helper(mode string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(helperBin, args...)
	cmd.Env = append([]string{helperEnv + "=" + mode, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	cmd.Dir = "/"
	return cmd
}

// runIn launches cmd in session name and returns its combined output.
func runIn(t *testing.T, b *Boundary, name string, cmd *exec.Cmd, ownPIDNS bool) string {
	t.Helper()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := b.Launch(name, cmd, LaunchOptions{}, ownPIDNS); err != nil {
		t.Fatalf("launch in %s: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s: timed out; output:\n%s", cmd.Path, out.String())
	}
	return out.String()
}

// results parses "RESULT op=X ok=true|false err=..." lines.
func results(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "RESULT "); ok {
			op, res, _ := strings.Cut(rest, " ")
			m[strings.TrimPrefix(op, "op=")] = res
		}
	}
	return m
}
