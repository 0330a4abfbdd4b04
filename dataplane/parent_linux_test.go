package dataplane

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestForeignParentRefused: a parent cgroup that exists with a child
// cgroup and a process in it, and that Shinken did not make, is refused by
// Open (nothing attached, nothing pinned) and by an uninstall (its process
// lives on, its child cgroup stays). An existing empty one is taken and
// marked; a parent an older agent made (sessions below it, no mark) is
// taken again on a restart because the pinned links are attached to it.
func TestForeignParentRefused(t *testing.T) {
	kerneltest.RequireRoot(t)
	root, err := FindCgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("foreign", func(t *testing.T) {
		cfg := testConfig(t)
		parent := filepath.Join(root, cfg.Parent)
		child := filepath.Join(parent, "service")
		if err := os.MkdirAll(child, 0o755); err != nil {
			t.Fatal(err)
		}
		sleep := exec.Command("sleep", "60")
		sleep.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true}
		cg, err := os.Open(child)
		if err != nil {
			t.Fatal(err)
		}
		sleep.SysProcAttr.CgroupFD = int(cg.Fd())
		if err := sleep.Start(); err != nil {
			t.Fatal(err)
		}
		cg.Close()
		t.Cleanup(func() {
			sleep.Process.Kill()
			sleep.Wait()
			os.Remove(child)
			os.Remove(parent)
		})
		if d, err := Open(cfg); !errors.Is(err, ErrForeignParent) {
			if err == nil {
				d.Uninstall()
			}
			t.Fatalf("Open on a foreign parent: %v, want ErrForeignParent", err)
		} else {
			t.Logf("Open refused: %v", err)
		}
		if _, err := os.Stat(cfg.PinPath); err == nil {
			t.Errorf("a refused Open left pins at %s", cfg.PinPath)
		}
		if err := Remove(cfg); !errors.Is(err, ErrForeignParent) {
			t.Errorf("uninstall of a foreign parent: %v, want ErrForeignParent", err)
		}
		if err := sleep.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("the foreign cgroup's process is gone: %v", err)
		}
		procs, err := os.ReadFile(filepath.Join(child, "cgroup.procs"))
		if err != nil || string(procs) != strconv.Itoa(sleep.Process.Pid)+"\n" {
			t.Errorf("the foreign child cgroup: %q, %v", procs, err)
		}
	})

	t.Run("empty and restarted", func(t *testing.T) {
		cfg := testConfig(t)
		parent := filepath.Join(root, cfg.Parent)
		if err := os.Mkdir(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		d := newDataplane(t, cfg)
		if _, err := unix.Getxattr(parent, parentMark, make([]byte, 8)); err != nil {
			t.Fatalf("an empty existing parent taken without the mark: %v", err)
		}
		if _, err := d.CreateSession("p1", Limits{}); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		// As an older agent left it: sessions below it, no mark.
		if err := unix.Removexattr(parent, parentMark); err != nil {
			t.Fatal(err)
		}
		d2 := newDataplane(t, cfg)
		if !d2.Adopted() {
			t.Fatal("the restart did not adopt the pins")
		}
		if _, err := unix.Getxattr(parent, parentMark, make([]byte, 8)); err != nil {
			t.Errorf("the restarted agent did not mark its parent: %v", err)
		}
		if _, err := os.Stat(filepath.Join(parent, "p1")); err != nil {
			t.Errorf("the session's cgroup after the restart: %v", err)
		}
	})
}
