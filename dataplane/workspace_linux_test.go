package dataplane

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestWorkspaceThroughDataplane: a session created with a workspace
// (Limits.Workspace) writes in it through the launcher and nowhere else; a
// workspace the host cannot give is refused and leaves no session; after
// the session's namespaces were remade while the agent was down,
// EnsureWorkspace puts the workspace back (and leaves a view in place
// alone).
func TestWorkspaceThroughDataplane(t *testing.T) {
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here (the boundary is tested on the host): %v", boundary.DefaultCatatonit, err)
	}
	cfg := testConfig(t)
	cfg.Boundary = &boundary.Config{}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := os.MkdirTemp("/var/tmp", "shinken-dp-ws-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(ws)
	os.Chmod(ws, 0o755)
	write := func(d *Dataplane, name, file string) (string, bool) {
		t.Helper()
		cmd := exec.Command("/bin/sh", "-c", "echo x > "+file)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &out, "/"
		if err := d.Launch(name, cmd, ProcOptions{}); err != nil {
			t.Fatal(err)
		}
		return out.String(), cmd.Wait() == nil
	}
	// Refused before anything exists: no such directory, a symlink, no
	// mode.
	os.Symlink(ws, ws+".link")
	defer os.Remove(ws + ".link")
	for _, w := range []backend.Workspace{
		{Dir: ws + "/missing", Mode: backend.ModeWorkspaceWrite},
		{Dir: ws + ".link", Mode: backend.ModeWorkspaceWrite},
		{Dir: ws, Mode: "full-access"},
		{Dir: "/", Mode: backend.ModeReadOnly},
	} {
		if _, err := d.CreateSession("ws-bad", Limits{Workspace: &w}); err == nil {
			t.Errorf("workspace %+v accepted", w)
		}
		if _, err := d.Session("ws-bad"); !errors.Is(err, ErrSessionNotFound) {
			t.Errorf("refused workspace %+v left a session: %v", w, err)
		}
	}
	if _, err := d.CreateSession("ws-w", Limits{Workspace: &backend.Workspace{Dir: ws, Mode: backend.ModeWorkspaceWrite}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateSession("ws-r", Limits{Workspace: &backend.Workspace{Dir: ws, Mode: backend.ModeReadOnly}}); err != nil {
		t.Fatal(err)
	}
	if out, ok := write(d, "ws-w", ws+"/a"); !ok {
		t.Fatalf("write in workspace-write: %s", out)
	}
	if _, ok := write(d, "ws-r", ws+"/b"); ok {
		t.Fatalf("write in a read-only workspace succeeded")
	}
	if _, ok := write(d, "ws-w", "/var/tmp/shinken-dp-ws-outside"); ok {
		os.Remove("/var/tmp/shinken-dp-ws-outside")
		t.Fatalf("write outside the workspace succeeded")
	}
	// In place: EnsureWorkspace leaves it (no second mount).
	w := backend.Workspace{Dir: ws, Mode: backend.ModeWorkspaceWrite}
	if err := d.EnsureWorkspace("ws-w", w); err != nil {
		t.Fatal(err)
	}
	// The agent goes down; the session's processes and namespaces die
	// (killed); the new dataplane remakes the holder, without the
	// workspace, until EnsureWorkspace (reconcile) puts it back.
	s, _ := d.Session("ws-w")
	d.Close()
	// (Each process by pid, not cgroup.kill: on this kernel a process
	// cloned into a cgroup after a cgroup.kill of it is killed too.)
	for i := 0; i < 200; i++ {
		b, _ := os.ReadFile(filepath.Join(s.Path, "cgroup.procs"))
		for _, p := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(s.Path, "cgroup.events")); strings.Contains(string(b), "populated 0") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	d2 := newDataplane(t, cfg)
	if e := d2.Probe().Facts["session_boundary_adopt_errors"]; e != "" {
		t.Fatalf("adoption: %s", e)
	}
	if _, ok := write(d2, "ws-w", ws+"/c"); ok {
		t.Fatalf("the remade view already had the workspace")
	}
	if err := d2.EnsureWorkspace("ws-w", w); err != nil {
		t.Fatal(err)
	}
	if out, ok := write(d2, "ws-w", ws+"/c"); !ok {
		t.Fatalf("after EnsureWorkspace: %s", out)
	}
	t.Logf("verified: workspace-write writes, read-only and outside refused, bad workspaces refused with no session left, EnsureWorkspace restores a remade view")
}
