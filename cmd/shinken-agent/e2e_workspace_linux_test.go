package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestWorkspaceQuickstart is the README's quickstart of a session with a
// workspace, through the daemon and shinkenctl: a checkout in the
// workspace is writable (git sees the new file), the rest of the host is
// not, what the session wrote belongs to the workspace's owner on the
// host; a restart of the agent keeps the view; read-only mode refuses the
// write.
func TestWorkspaceQuickstart(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	ws, err := os.MkdirTemp("/var/tmp", "shinken-e2e-ws-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(ws)
	os.Chmod(ws, 0o755)
	src := filepath.Join(ws, "src")
	for _, args := range [][]string{{"init", "-q", src}, {"-C", src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"}, {"clone", "-q", src, filepath.Join(ws, "repo")}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	e.mustCtl("session", "create", "dev", "-image", "e2e", "-workspace", ws, "-mode", "workspace-write")
	out := e.mustCtl("run", "dev", "--", "sh", "-c", "cd "+ws+"/repo && echo hi > NOTE && git status --short")
	if !strings.Contains(out, "?? NOTE") {
		t.Errorf("git status in the workspace: %q", out)
	}
	if out, err := e.ctl("run", "dev", "--", "sh", "-c", "echo x > /var/tmp/shinken-e2e-elsewhere"); err == nil {
		os.Remove("/var/tmp/shinken-e2e-elsewhere")
		t.Errorf("a write outside the workspace succeeded: %s", out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(ws, "repo", "NOTE"), &st); err != nil || st.Uid != 0 {
		t.Errorf("NOTE on the host: uid %d, %v (want the workspace owner, 0)", st.Uid, err)
	}
	e.stopAgent(syscall.SIGTERM)
	e.startAgent()
	e.mustCtl("run", "dev", "--", "sh", "-c", "echo again >> "+ws+"/repo/NOTE")
	e.mustCtl("session", "rm", "dev")
	e.mustCtl("session", "create", "ro", "-image", "e2e", "-workspace", ws, "-mode", "read-only")
	if out, err := e.ctl("run", "ro", "--", "sh", "-c", "echo x >> "+ws+"/repo/NOTE"); err == nil {
		t.Errorf("a write in a read-only workspace succeeded: %s", out)
	}
	if out := e.mustCtl("run", "ro", "--", "cat", ws+"/repo/NOTE"); !strings.Contains(out, "again") {
		t.Errorf("read in a read-only workspace: %q", out)
	}
}
