package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// fsTree makes, under /var/tmp (visible read-only in sessions), the tree
// the fs.scope tests grant parts of; every file holds "data".
func fsTree(t testing.TB) string {
	t.Helper()
	root, err := os.MkdirTemp("/var/tmp", "shinken-fs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)
	for _, f := range []string{"repo/f", "repo/a/f", "repo/a/b/f", "other/f", "home/u/notes", "home/u/.ssh/id_ed25519", "secret/f"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Owner-only, as a credential would be: the session reads it only
	// if a view shows it as the session's.
	os.Chmod(filepath.Join(root, "home/u/.ssh/id_ed25519"), 0o600)
	os.Chmod(filepath.Join(root, "secret"), 0o700)
	return root
}

// fsSession opens a dataplane with the boundary, whose credential
// locations are root/home/u/.ssh and root/secret (fixed: as the agent's
// own would be), and makes one session.
func fsSession(t *testing.T) (*Dataplane, string) {
	t.Helper()
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here (the boundary is tested on the host): %v", boundary.DefaultCatatonit, err)
	}
	root := fsTree(t)
	cfg := testConfig(t)
	cfg.Boundary = &boundary.Config{FileNever: []string{root + "/home/u/.ssh", root + "/secret"}, FileNeverFixed: []string{root + "/secret"}}
	d := newDataplane(t, cfg)
	if _, err := d.CreateSession("fs", Limits{}); err != nil {
		t.Fatal(err)
	}
	return d, root
}

// sh runs script in the session fs and says whether it exited 0.
func sh(t *testing.T, d *Dataplane, script string) (bool, string) {
	t.Helper()
	return shIn(t, d, "fs", script)
}

func shIn(t *testing.T, d *Dataplane, session, script string) (bool, string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &out, "/"
	if err := d.Launch(session, cmd, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	return cmd.Wait() == nil, strings.TrimSpace(out.String())
}

func wantSh(t *testing.T, d *Dataplane, what, script string, ok bool) {
	t.Helper()
	got, out := sh(t, d, script)
	if got != ok {
		t.Errorf("%s: ok=%v, want %v (%s)", what, got, ok, out)
	} else {
		t.Logf("verified: %s: ok=%v", what, ok)
	}
}

// revokeCounted revokes h and checks that it took one handle write and
// sweeps view sweeps (Ops); it says whether it did.
func revokeCounted(t *testing.T, d *Dataplane, h HandleRef, sweeps uint64) bool {
	t.Helper()
	before := d.Ops()
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	after := d.Ops()
	if w, v := after.RevokeWrites-before.RevokeWrites, after.ViewSweeps-before.ViewSweeps; w != 1 || v != sweeps {
		t.Errorf("revoke: %d handle writes and %d view sweeps, want 1 and %d", w, v, sweeps)
		return false
	}
	return true
}

func fileGrant(t *testing.T, d *Dataplane, entries ...backend.FileEntry) HandleRef {
	t.Helper()
	h, err := d.NewHandle(HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range entries {
		entries[i].Handle = h
	}
	if err := d.Apply("fs", backend.Delta{Files: entries}); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestFileScope: reads, writes, creates and deletes inside and outside a
// granted scope, the nested write/deny/write case across grants, a
// revoke making the next open fail (one write, one view sweep), and the
// Snapshot and Release of the files section.
func TestFileScope(t *testing.T) {
	d, r := fsSession(t)
	wantSh(t, d, "write before any grant", "echo x >> "+r+"/repo/f", false)
	// write and delete: where BPF LSM is active (.ci/vmtest) write alone
	// deletes nothing (TestFileScopeDelete); the mount view cannot tell.
	h1 := fileGrant(t, d, backend.FileEntry{Path: r + "/repo", Access: backend.FileWrite}, backend.FileEntry{Path: r + "/repo", Access: backend.FileDelete}, backend.FileEntry{Path: r + "/repo/a", Access: backend.FileDeny})
	wantSh(t, d, "write in scope", "echo x >> "+r+"/repo/f", true)
	wantSh(t, d, "create and delete in scope", "echo x > "+r+"/repo/new && rm "+r+"/repo/new", true)
	wantSh(t, d, "write under the grant's deny", "echo x >> "+r+"/repo/a/f", false)
	wantSh(t, d, "read under the grant's deny", "cat "+r+"/repo/a/f", false)
	wantSh(t, d, "create under the grant's deny", "echo x > "+r+"/repo/a/new", false)
	wantSh(t, d, "delete under the grant's deny", "rm "+r+"/repo/a/f", false)
	wantSh(t, d, "write outside the scope", "echo x >> "+r+"/other/f", false)
	wantSh(t, d, "delete outside the scope", "rm "+r+"/other/f", false)
	for _, f := range []string{"/repo/a/f", "/other/f"} {
		if _, err := os.Stat(r + f); err != nil {
			t.Errorf("%s gone on the host: %v", f, err)
		}
	}
	if b, _ := os.ReadFile(r + "/repo/f"); string(b) != "data\nx\n" {
		t.Errorf("repo/f on the host: %q", b)
	}
	// Nested: another grant opens /repo/a/b inside the first one's deny.
	h2 := fileGrant(t, d, backend.FileEntry{Path: r + "/repo/a/b", Access: backend.FileWrite})
	wantSh(t, d, "nested write/deny/write: the inner write", "echo x >> "+r+"/repo/a/b/f", true)
	wantSh(t, d, "nested write/deny/write: the deny between", "echo x >> "+r+"/repo/a/f", false)
	wantSh(t, d, "nested write/deny/write: the outer write", "echo x >> "+r+"/repo/f", true)
	snap, err := d.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if m := (backend.Delta{Files: []backend.FileEntry{{Path: r + "/repo/a/b", Access: backend.FileWrite, Handle: h2}}}).Missing(snap.Deltas["fs"]); m != "" {
		t.Errorf("snapshot lacks %s", m)
	}
	// Revoke the outer grant: one write, one view sweep; the next open
	// under it fails, the inner grant stays.
	revokeCounted(t, d, h1, 1)
	wantSh(t, d, "write after the revoke", "echo x >> "+r+"/repo/f", false)
	wantSh(t, d, "the other grant after the revoke", "echo x >> "+r+"/repo/a/b/f", true)
	if err := d.Release("fs", h1, backend.Delta{Files: []backend.FileEntry{{Path: r + "/repo", Access: backend.FileWrite, Handle: h1}, {Path: r + "/repo", Access: backend.FileDelete, Handle: h1}, {Path: r + "/repo/a", Access: backend.FileDeny, Handle: h1}}}); err != nil {
		t.Fatal(err)
	}
	if snap, _ := d.Snapshot(); slices.ContainsFunc(snap.Deltas["fs"].Files, func(e backend.FileEntry) bool { return e.Handle == h1 }) {
		t.Errorf("released entries still in the snapshot")
	}
	// Bad input changes nothing: a path that does not exist, an
	// approve-once handle.
	h3, _ := d.NewHandle(HandleRef{}, time.Time{})
	if err := d.Apply("fs", backend.Delta{Files: []backend.FileEntry{{Path: r + "/missing", Access: backend.FileWrite, Handle: h3}}}); err == nil {
		t.Errorf("a missing path was applied")
	}
	once, _ := d.NewOnceHandle(HandleRef{}, time.Time{})
	if err := d.Apply("fs", backend.Delta{Files: []backend.FileEntry{{Path: r + "/other", Access: backend.FileWrite, Handle: once}}}); err == nil {
		t.Errorf("an approve-once file grant was applied")
	}
	// A path in the host's /tmp: the session has its own /tmp, so the
	// view could neither show it nor hide it there. Refused with why;
	// before, the mount failed inside the session's namespace at the
	// next view change or launch.
	tmp, err := os.MkdirTemp("/tmp", "shinken-fs-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	h4, _ := d.NewHandle(HandleRef{}, time.Time{})
	for _, a := range []backend.FileAccess{backend.FileRead, backend.FileWrite, backend.FileDeny} {
		err := d.Apply("fs", backend.Delta{Files: []backend.FileEntry{{Path: r + "/other", Access: backend.FileWrite, Handle: h4}, {Path: tmp, Access: a, Handle: h4}}})
		if !errors.Is(err, backend.ErrInvalidFileEntry) || !strings.Contains(err.Error(), "lies in /tmp") {
			t.Errorf("%s entry in /tmp: %v, want ErrInvalidFileEntry saying it lies in /tmp", a, err)
		}
	}
	wantSh(t, d, "write outside after refused applies", "echo x >> "+r+"/other/f", false)
	wantSh(t, d, "write in the remaining grant after refused applies", "echo x >> "+r+"/repo/a/b/f", true)
}

// TestFileScopeCredentials: credential locations stay denied under a
// broad grant (read and write); the rest of the grant works.
func TestFileScopeCredentials(t *testing.T) {
	d, r := fsSession(t)
	// read and write: where BPF LSM is active (.ci/vmtest) write alone
	// reads nothing.
	fileGrant(t, d, backend.FileEntry{Path: r, Access: backend.FileRead}, backend.FileEntry{Path: r, Access: backend.FileWrite})
	wantSh(t, d, "read a credential under a broad grant", "cat "+r+"/home/u/.ssh/id_ed25519", false)
	wantSh(t, d, "list a credential directory under a broad grant", "ls "+r+"/home/u/.ssh | grep -q id", false)
	wantSh(t, d, "write a credential under a broad grant", "echo x > "+r+"/home/u/.ssh/authorized_keys", false)
	wantSh(t, d, "read an owner-only credential dir under a broad grant", "cat "+r+"/secret/f", false)
	wantSh(t, d, "read beside the credential", "cat "+r+"/home/u/notes", true)
	wantSh(t, d, "write beside the credential", "echo x >> "+r+"/home/u/notes", true)
	// A grant naming the credential itself is masked too.
	fileGrant(t, d, backend.FileEntry{Path: r + "/home/u/.ssh", Access: backend.FileRead})
	wantSh(t, d, "read a credential its own grant names", "cat "+r+"/home/u/.ssh/id_ed25519", false)
}

// TestFileScopeEscapes: the ways code in a session would reach outside
// its write scope or into a denied path: a symlink, "..", a hard link, a
// rename, a bind mount (and a new mount namespace), /proc/self/root.
func TestFileScopeEscapes(t *testing.T) {
	d, r := fsSession(t)
	fileGrant(t, d, backend.FileEntry{Path: r + "/repo", Access: backend.FileWrite}, backend.FileEntry{Path: r + "/repo/a", Access: backend.FileDeny})
	for what, script := range map[string]string{
		"symlink out of scope":             "ln -s " + r + "/other " + r + "/repo/lnk && echo x >> " + r + "/repo/lnk/f",
		"symlink into the deny":            "ln -sf " + r + "/repo/a " + r + "/repo/lnk2 && cat " + r + "/repo/lnk2/f",
		"dot-dot out of scope":             "echo x >> " + r + "/repo/../other/f",
		"dot-dot into the deny":            "cat " + r + "/repo/a/b/../f",
		"hard link of an outside file":     "ln " + r + "/other/f " + r + "/repo/hl && echo x >> " + r + "/repo/hl",
		"rename a file out of scope":       "mv " + r + "/repo/f " + r + "/other/moved",
		"rename an outside file in":        "mv " + r + "/other/f " + r + "/repo/moved",
		"rename the denied dir":            "mv " + r + "/repo/a " + r + "/repo/a2 && cat " + r + "/repo/a2/f",
		"bind mount over the scope":        "mount --bind " + r + "/repo " + r + "/other",
		"new mount namespace":              "unshare -m true",
		"/proc/self/root out of scope":     "echo x >> /proc/self/root" + r + "/other/f",
		"/proc/self/root into the deny":    "cat /proc/self/root" + r + "/repo/a/f",
		"/proc/1/root (the holder's view)": "cat /proc/1/root" + r + "/repo/a/f",
	} {
		wantSh(t, d, what, script, false)
	}
	if b, _ := os.ReadFile(r + "/other/f"); string(b) != "data\n" {
		t.Errorf("other/f changed on the host: %q", b)
	}
	// A parent swapped for a symlink under a write root, then the root
	// revoked while a nested grant stays: the view would now mount the
	// nested path, which names what the link names (/etc/ssh, root's,
	// shown as the session's); a path with a link on the way is refused.
	// (delete too: the rename away needs it where BPF LSM is active.)
	hOuter := fileGrant(t, d, backend.FileEntry{Path: r + "/other", Access: backend.FileWrite}, backend.FileEntry{Path: r + "/other", Access: backend.FileDelete})
	if err := os.MkdirAll(r+"/other/c/ssh", 0o755); err != nil {
		t.Fatal(err)
	}
	hNested := fileGrant(t, d, backend.FileEntry{Path: r + "/other/c/ssh", Access: backend.FileWrite})
	wantSh(t, d, "swap a parent for a symlink", "mv "+r+"/other/c "+r+"/other/c-old && ln -s /etc "+r+"/other/c", true)
	err := d.Revoke(hOuter)
	t.Logf("revoke with a symlinked parent of a nested grant: %v", err)
	wantSh(t, d, "write where the link points", "touch /etc/ssh/shinken-fs-test", false)
	wantSh(t, d, "write in the revoked root", "echo x >> "+r+"/other/f", false)
	os.Remove("/etc/ssh/shinken-fs-test")
	// Until the grant whose path was poisoned goes, no view can be made:
	// the session keeps the host's read-only root (fail-closed).
	if err := d.Revoke(hNested); err != nil {
		t.Fatal(err)
	}
	// A mount below a write root cannot be carried away by renaming a
	// directory between them (the next change would then miss it): those
	// directories are mount points.
	if err := os.MkdirAll(r+"/deep/d/e/out", 0o755); err != nil {
		t.Fatal(err)
	}
	fileGrant(t, d, backend.FileEntry{Path: r + "/deep", Access: backend.FileWrite}, backend.FileEntry{Path: r + "/deep/d/e/out", Access: backend.FileDeny})
	wantSh(t, d, "rename a directory above a nested mount", "mv "+r+"/deep/d "+r+"/deep/d2", false)
	wantSh(t, d, "rename the directory just above it", "mv "+r+"/deep/d/e "+r+"/deep/d/e2", false)
	wantSh(t, d, "write beside them", "echo x > "+r+"/deep/d/new", true)
}

// TestFileScopeLiveShell: a grant made while a shell runs in the session
// takes effect at its next open; a revoke makes its next open fail, even
// with its working directory inside the revoked root; a descriptor opened
// before the revoke keeps working (what the mount view cannot take back).
func TestFileScopeLiveShell(t *testing.T) {
	d, r := fsSession(t)
	cmd := exec.Command("/bin/sh", "-c", `while read -r line; do eval "$line" >/dev/null 2>&1; echo "RC $?"; done`)
	cmd.Dir = "/"
	in, _ := cmd.StdinPipe()
	outp, _ := cmd.StdoutPipe()
	if err := d.Launch("fs", cmd, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	rd := bufio.NewReader(outp)
	run := func(what, line string, want bool) {
		t.Helper()
		io.WriteString(in, line+"\n")
		l, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: shell: %v", what, err)
		}
		if ok := strings.TrimSpace(l) == "RC 0"; ok != want {
			t.Errorf("%s: %s, want ok=%v", what, strings.TrimSpace(l), want)
		} else {
			t.Logf("verified: %s: ok=%v", what, want)
		}
	}
	run("write before the grant", "echo x >> "+r+"/other/f", false)
	h := fileGrant(t, d, backend.FileEntry{Path: r + "/other", Access: backend.FileWrite})
	run("write after a grant made while the shell runs", "echo x >> "+r+"/other/f", true)
	run("cd into the granted root", "cd "+r+"/other", true)
	run("relative write with the working directory inside", "echo y >> f", true)
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	run("absolute write after the revoke", "echo x >> "+r+"/other/f", false)
	run("relative write from a working directory inside the revoked root", "echo y >> f", false)
	run("create from a working directory inside the revoked root", "echo y > new", false)
	// What the mount view cannot take back (the probe row and the README
	// say so): a descriptor opened for writing before the revoke keeps
	// writing, and while it is open the kernel refuses to make the mount
	// read-only, so relative writes from a working directory inside it
	// keep working too, until the shell leaves it.
	h2 := fileGrant(t, d, backend.FileEntry{Path: r + "/other", Access: backend.FileWrite})
	run("cd into the granted root again", "cd / && cd "+r+"/other", true)
	run("open a descriptor for writing before the revoke", "exec 3>>f", true)
	if err := d.Revoke(h2); err != nil {
		t.Fatal(err)
	}
	run("absolute write after the second revoke", "echo x >> "+r+"/other/f", false)
	run("write through the descriptor opened before the revoke (not revocable here)", "echo z >&3", true)
	run("relative write from inside while that descriptor is open (not revocable here)", "echo y >> f", true)
	run("cd out and back", "exec 3>&- && cd / && cd "+r+"/other", true)
	run("relative write after leaving and re-entering", "echo y >> f", false)
	fmt.Fprintln(in, "true") // keep the protocol in step
	rd.ReadString('\n')
}

// TestFileScopeRestart: the file entries outlive the agent (a pinned
// table): a new dataplane reports them in Snapshot, keeps the view they
// make, and a revoke through it takes the view back; a session destroyed
// takes its entries with it.
func TestFileScopeRestart(t *testing.T) {
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here: %v", boundary.DefaultCatatonit, err)
	}
	r := fsTree(t)
	cfg := testConfig(t)
	cfg.Boundary = &boundary.Config{FileNever: []string{r + "/home/u/.ssh"}, Accept: boundaryAccept(t)}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateSession("fs", Limits{}); err != nil {
		t.Fatal(err)
	}
	h := fileGrant(t, d, backend.FileEntry{Path: r + "/repo", Access: backend.FileWrite}, backend.FileEntry{Path: r + "/repo/a", Access: backend.FileDeny})
	wantSh(t, d, "write before the restart", "echo x >> "+r+"/repo/f", true)
	d.Close()
	d2 := newDataplane(t, cfg)
	if e := d2.Probe().Facts["session_boundary_adopt_errors"]; e != "" {
		t.Fatalf("adoption: %s", e)
	}
	snap, err := d2.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	want := backend.Delta{Files: []backend.FileEntry{{Path: r + "/repo", Access: backend.FileWrite, Handle: h}, {Path: r + "/repo/a", Access: backend.FileDeny, Handle: h}}}
	if m := want.Missing(snap.Deltas["fs"]); m != "" {
		t.Fatalf("after the restart the snapshot lacks %s", m)
	}
	wantSh(t, d2, "write after the restart", "echo x >> "+r+"/repo/f", true)
	wantSh(t, d2, "the deny after the restart", "cat "+r+"/repo/a/f", false)
	if err := d2.Revoke(h); err != nil {
		t.Fatal(err)
	}
	wantSh(t, d2, "write after a revoke by the new agent", "echo x >> "+r+"/repo/f", false)
	h2 := func() HandleRef {
		h, _ := d2.NewHandle(HandleRef{}, time.Time{})
		if err := d2.Apply("fs", backend.Delta{Files: []backend.FileEntry{{Path: r + "/other", Access: backend.FileWrite, Handle: h}}}); err != nil {
			t.Fatal(err)
		}
		return h
	}()
	_ = h2
	if err := d2.DestroySession("fs"); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.CreateSession("fs2", Limits{}); err != nil {
		t.Fatal(err)
	}
	if snap, _ := d2.Snapshot(); len(snap.Deltas["fs2"].Files) != 0 || len(snap.Deltas["fs"].Files) != 0 {
		t.Errorf("entries outlived their session: %+v", snap.Deltas)
	}
}
