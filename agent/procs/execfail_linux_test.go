package procs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
)

// TestExecFailureIsTheRequests: a program the launch cannot execute fails
// the start as the request's fault (backend.ErrExecFailed: not there;
// ErrExecDenied: not executable), with the launcher's reason, leaves no
// process, and the next start works.
func TestExecFailureIsTheRequests(t *testing.T) {
	r := newRig(t, 0)
	// Files the session sees (the host's /var/tmp, read-only; its /tmp is
	// its own): one not executable, one executable but no program.
	dir, err := os.MkdirTemp("/var/tmp", "shinken-procs-exec-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	for name, mode := range map[string]os.FileMode{"data": 0o644, "junk": 0o755} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("\x00\x01 not a program\n"), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(dir, name), mode)
	}
	for _, c := range []struct {
		argv []string
		kind error
		why  string
	}{
		{[]string{"/usr/bin/no-such-program"}, backend.ErrExecFailed, "no such file or directory"},
		{[]string{dir + "/junk"}, backend.ErrExecFailed, "exec format error"},
		{[]string{dir + "/data"}, backend.ErrExecDenied, "permission denied"},
	} {
		_, err := r.m.Start(r.session, wire.ProcessStart{Argv: c.argv}, "test")
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), "exec "+c.argv[0]+": "+c.why) {
			t.Errorf("start %v: %v, want %v saying %q", c.argv, err, c.kind, c.why)
		} else {
			t.Logf("verified: start %v: %v", c.argv, err)
		}
	}
	if ps := r.m.List(r.session); len(ps) != 0 {
		t.Errorf("failed starts left processes: %+v", ps)
	}
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/echo", "ok"}})
	if out, _ := readAll(t, p, 0, 0, 10*time.Second); out != "ok\n" {
		t.Errorf("the start after: %q", out)
	}
}
