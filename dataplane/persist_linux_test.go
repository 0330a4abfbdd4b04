package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"golang.org/x/sys/unix"
)

// TestPersistence: a persistent path with survives_session keeps what a
// session wrote there after the session is destroyed and shows it to the
// next session of that name (not to another name, nor on the host path);
// without survives_session it goes with the session; a revoke makes the
// next write fail; ForgetPersisted removes what was kept. As an overlay
// (the host's content shows, changes stay in the name's directory) and as
// the bind fallback (boundary.Config.PersistBind: the name's directory
// alone).
func TestPersistence(t *testing.T) {
	for _, bind := range []bool{false, true} {
		t.Run(map[bool]string{false: "overlay", true: "bind"}[bind], func(t *testing.T) { testPersistence(t, bind) })
	}
}

func testPersistence(t *testing.T, bind bool) {
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
	cfg.Boundary = &boundary.Config{FileNever: []string{r + "/home/u/.ssh", pdir}, FileNeverFixed: []string{pdir}, PersistDir: pdir, PersistBind: bind}
	d := newDataplane(t, cfg)
	lvl := d.Probe().Class(backend.ClassPersistence)
	if !lvl.Level.Enforceable() {
		t.Fatalf("persistence: %s", lvl.Reason)
	}
	// On this kernel (6.18) a persistent path is an overlay over the
	// host's directory; the bind (the session name's directory alone) is
	// the fallback the row names where one cannot be made.
	overlay := d.bnd.PersistOverlay() == nil
	if bind && overlay {
		t.Fatal("PersistBind: an overlay anyway")
	}
	t.Logf("persistence: %s (overlay: %v, %v)", lvl.Mechanism, overlay, d.bnd.PersistOverlay())
	if !overlay && !bind && kernelAtLeast(6, 8) { // overlay layers by descriptor (fsconfig lowerdir+)
		t.Errorf("no overlay for persistent paths on this kernel: %v", d.bnd.PersistOverlay())
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
	if overlay {
		// The host's content shows (the lower layer); the session's
		// changes to it stay in its upper layer; the credential location
		// under the path stays masked.
		if !run("fs", "grep -q data "+cache+"/notes && echo mine >> "+cache+"/notes && rm "+scratch+"/f") {
			t.Errorf("the host's content under the persistent paths: not readable, writable or deletable")
		}
		if b, _ := os.ReadFile(cache + "/notes"); string(b) != "data\n" {
			t.Errorf("a write to host content in a persistent path reached the host: %q", b)
		}
		if _, err := os.Stat(scratch + "/f"); err != nil {
			t.Errorf("a delete in a persistent path reached the host: %v", err)
		}
		if run("fs", "cat "+cache+"/.ssh/id_ed25519") || run("fs", "ls "+cache+"/.ssh | grep -q id") {
			t.Errorf("a credential location under a persistent path is readable")
		}
	} else if !run("fs", "! test -e "+cache+"/notes") {
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
	if overlay && !run("fs", "grep -q mine "+cache+"/notes") {
		t.Errorf("the next session of the name does not see its change to the host's file")
	}
	if run("fs", "test -e "+scratch+"/s") {
		t.Errorf("a session-only write came back")
	}
	if overlay && !run("fs", "test -e "+scratch+"/f") {
		t.Errorf("a session-only delete outlived its session")
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

// kernelAtLeast reports whether the running kernel is major.minor or
// newer.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || ma == major && mi >= minor
}

// TestPersistenceRestart: an overlay persistent path outlives the agent:
// a new dataplane adopts the session, reads its view back (the overlay is
// known by its source), the session keeps writing there, and a revoke by
// the new agent detaches it (the next write fails).
func TestPersistenceRestart(t *testing.T) {
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here: %v", boundary.DefaultCatatonit, err)
	}
	r := fsTree(t)
	pdir, err := os.MkdirTemp("/var/tmp", "shinken-persist-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pdir) })
	cfg := testConfig(t)
	cfg.Boundary = &boundary.Config{FileNever: []string{r + "/home/u/.ssh", pdir}, FileNeverFixed: []string{pdir}, PersistDir: pdir, Accept: boundaryAccept(t)}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if why := d.bnd.PersistOverlay(); why != nil {
		d.Close()
		t.Skipf("no overlay here: %v", why) // (d.bnd is gone after Close)
	}
	if _, err := d.CreateSession("fs", Limits{}); err != nil {
		t.Fatal(err)
	}
	cache := r + "/home/u"
	h := fileGrant(t, d, backend.FileEntry{Path: cache, Access: backend.FilePersist})
	wantSh(t, d, "write before the restart", "echo kept > "+cache+"/k && grep -q data "+cache+"/notes", true)
	d.Close()
	d2 := newDataplane(t, cfg)
	if e := d2.Probe().Facts["session_boundary_adopt_errors"]; e != "" {
		t.Fatalf("adoption: %s", e)
	}
	wantSh(t, d2, "write after the restart", "echo more >> "+cache+"/k && grep -q data "+cache+"/notes", true)
	if err := d2.Revoke(h); err != nil {
		t.Fatal(err)
	}
	wantSh(t, d2, "write after a revoke by the new agent", "echo x >> "+cache+"/k2", false)
	wantSh(t, d2, "the kept file after the revoke (the host path shows again)", "test -e "+cache+"/k", false)
}
