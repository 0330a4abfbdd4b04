package dataplane

import (
	"bufio"
	"errors"
	"io"
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
	cfg.Boundary = &boundary.Config{Accept: boundaryAccept(t)}
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
	// A directory in the host's /tmp: each session has a /tmp of its own,
	// so the view could not show it. Refused at create with why, not at
	// the session's first launch (before, the create passed and every
	// launch after it failed: "open ... no such file or directory").
	tmpWS, err := os.MkdirTemp("/tmp", "shinken-dp-ws-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmpWS)
	_, err = d.CreateSession("ws-tmp", Limits{Workspace: &backend.Workspace{Dir: tmpWS, Mode: backend.ModeWorkspaceWrite}})
	if !errors.Is(err, backend.ErrInvalidSession) || !strings.Contains(err.Error(), "lies in /tmp") {
		t.Errorf("workspace in /tmp: %v, want ErrInvalidSession saying it lies in /tmp", err)
	}
	if _, err := d.Session("ws-tmp"); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("refused workspace in /tmp left a session: %v", err)
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
	// The agent restarts while a shell works in the workspace: the view
	// is left as it is (the workspace is in the pinned table), so its
	// relative writes go on.
	sh := exec.Command("/bin/sh", "-c", `cd `+ws+` && while read -r l; do eval "$l" >/dev/null 2>&1; echo "RC $?"; done`)
	sh.Dir = "/"
	in, _ := sh.StdinPipe()
	outp, _ := sh.StdoutPipe()
	if err := d.Launch("ws-w", sh, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(outp)
	say := func(line string) string {
		io.WriteString(in, line+"\n")
		l, _ := rd.ReadString('\n')
		return strings.TrimSpace(l)
	}
	if got := say("echo 1 >> rel"); got != "RC 0" {
		t.Fatalf("relative write before the restart: %s", got)
	}
	d.Close()
	dMid := newDataplane(t, cfg)
	if got := say("echo 2 >> rel"); got != "RC 0" {
		t.Errorf("relative write from inside the workspace after an agent restart: %s", got)
	}
	in.Close()
	sh.Wait()
	d = dMid
	// The agent goes down; the session's processes and namespaces die
	// (killed); the new dataplane remakes the holder and the workspace
	// with it (from the pinned table).
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
	if out, ok := write(d2, "ws-w", ws+"/c"); !ok {
		t.Fatalf("the remade view lacks the workspace: %s", out)
	}
	if err := d2.EnsureWorkspace("ws-w", w); err != nil {
		t.Fatal(err)
	}
	if out, ok := write(d2, "ws-w", ws+"/d"); !ok {
		t.Fatalf("after EnsureWorkspace: %s", out)
	}
	t.Logf("verified: workspace-write writes, read-only and outside refused, bad workspaces refused with no session left, the view survives an agent restart untouched and comes back with a remade holder")
}
