package dataplane

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestLazyHolderThroughDataplane (issue 21): through the dataplane, a
// created session has its cgroup and kernel entry but no process (no
// holder); removing one that was never launched into leaves no cgroup and
// no session; a restarted dataplane adopts a session that never had a
// holder without starting one, and a launch into it then works (in a
// holder started by that launch, as the session's uid).
func TestLazyHolderThroughDataplane(t *testing.T) {
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here (the boundary is tested on the host): %v", boundary.DefaultCatatonit, err)
	}
	cfg := testConfig(t)
	cfg.Boundary = &boundary.Config{Accept: boundaryAccept(t)}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := d.CreateSession("lz-idle", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := d.CreateSession("lz-gone", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []Session{idle, gone} {
		procs, err := os.ReadFile(s.Path + "/cgroup.procs")
		if err != nil || len(strings.TrimSpace(string(procs))) != 0 {
			t.Errorf("%s after create: cgroup.procs %q (%v), want no process", s.Name, procs, err)
		}
		if run, err := d.HolderRunning(s.Name); err != nil || run {
			t.Errorf("%s after create: holder running %v (%v), want false", s.Name, run, err)
		}
	}
	if err := d.DestroySession("lz-gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gone.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed never-launched session: its cgroup %s: %v, want gone", gone.Path, err)
	}
	if _, err := d.Session("lz-gone"); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("removed never-launched session still known: %v", err)
	}
	if _, err := d.HolderRunning("lz-gone"); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("removed never-launched session: HolderRunning %v, want ErrSessionNotFound", err)
	}

	// Restart: the new dataplane adopts lz-idle, which has no holder.
	d.Close()
	d2 := newDataplane(t, cfg)
	if run, err := d2.HolderRunning("lz-idle"); err != nil || run {
		t.Fatalf("adopted holderless session: holder running %v (%v), want false", run, err)
	}
	if procs, _ := os.ReadFile(idle.Path + "/cgroup.procs"); len(strings.TrimSpace(string(procs))) != 0 {
		t.Errorf("adoption started a process in the holderless session: %q", procs)
	}
	cmd := exec.Command("/bin/sh", "-c", "id -u; cat /proc/1/comm")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &out, "/"
	if err := d2.Launch("lz-idle", cmd, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	uid, _ := d2.SessionUID("lz-idle")
	if f := strings.Fields(out.String()); len(f) != 2 || f[0] != strconv.FormatUint(uint64(uid), 10) || f[1] != "catatonit" {
		t.Errorf("launch into the adopted holderless session: %q, want uid %d and catatonit as pid 1", out.String(), uid)
	}
	if run, err := d2.HolderRunning("lz-idle"); err != nil || !run {
		t.Errorf("after the launch: holder running %v (%v), want true", run, err)
	}
}
