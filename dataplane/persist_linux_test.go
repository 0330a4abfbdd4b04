package dataplane

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestPersistence: a persistent path with survives_session keeps what a
// session wrote there after the session is destroyed and shows it to the
// next session of that name (not to another name, nor on the host path);
// without survives_session it goes with the session; a revoke makes the
// next write fail; ForgetPersisted removes what was kept.
func TestPersistence(t *testing.T) {
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here: %v", boundary.DefaultCatatonit, err)
	}
	r := fsTree(t)
	// As the agent has it: the persistent paths' directory lies in a
	// credential location (its state directory), outside /tmp, so the
	// Landlock baseline denies it but for each persistence mount's root.
	pdir, err := os.MkdirTemp("/var/tmp", "shinken-persist-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pdir) })
	cfg := testConfig(t)
	cfg.Boundary = &boundary.Config{FileNever: []string{r + "/home/u/.ssh", pdir}, PersistDir: pdir}
	d := newDataplane(t, cfg)
	if lvl := d.Probe().Class(backend.ClassPersistence); !lvl.Level.Enforceable() {
		t.Fatalf("persistence: %s", lvl.Reason)
	}
	cache, scratch := r+"/home/u", r+"/other"
	session := func(name string) {
		t.Helper()
		if _, err := d.CreateSession(name, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	grant := func(name string) HandleRef {
		t.Helper()
		h, err := d.NewHandle(HandleRef{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Apply(name, backend.Delta{Files: []backend.FileEntry{
			{Path: cache, Access: backend.FilePersist, Handle: h},
			{Path: scratch, Access: backend.FilePersistSession, Handle: h},
		}}); err != nil {
			t.Fatal(err)
		}
		return h
	}
	run := func(name, script string) bool {
		t.Helper()
		ok, _ := shIn(t, d, name, script)
		return ok
	}
	session("fs")
	grant("fs")
	if !run("fs", "echo kept > "+cache+"/k && echo gone > "+scratch+"/s && cat "+cache+"/k") {
		t.Fatal("writes in the persistent paths failed")
	}
	if _, err := os.Stat(cache + "/k"); err == nil {
		t.Errorf("the persistent write reached the host path")
	}
	if !run("fs", "! test -e "+cache+"/notes") {
		t.Errorf("the host's own content shows through the persistent path")
	}
	if err := d.DestroySession("fs"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pdir, "session", "fs")); !os.IsNotExist(err) {
		t.Errorf("the session-only directory outlived its session: %v", err)
	}
	session("fs")
	h := grant("fs")
	if !run("fs", "grep -q kept "+cache+"/k") {
		t.Errorf("the next session of the name does not see what was kept")
	}
	if run("fs", "test -e "+scratch+"/s") {
		t.Errorf("a session-only write came back")
	}
	session("other")
	grant("other")
	if run("other", "test -e "+cache+"/k") {
		t.Errorf("another session name sees what fs kept")
	}
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	if run("fs", "echo x > "+cache+"/k2") {
		t.Errorf("write in a persistent path after the revoke")
	}
	if err := d.bnd.ForgetPersisted("fs"); err == nil {
		t.Errorf("forgot the persisted paths of a live session")
	}
	if err := d.DestroySession("fs"); err != nil {
		t.Fatal(err)
	}
	if err := d.bnd.ForgetPersisted("fs"); err != nil {
		t.Fatal(err)
	}
	session("fs")
	grant("fs")
	if run("fs", "test -e "+cache+"/k") {
		t.Errorf("a forgotten path came back")
	}
}
