package dataplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// lsmDataplane opens a dataplane without the session boundary and skips
// unless its probe says fs.scope is revocable in-kernel (the BPF LSM
// programs attached): a host without BPF LSM (this project's build host)
// cannot load them; .ci/vmtest boots a kernel that can.
func lsmDataplane(t *testing.T) *Dataplane {
	t.Helper()
	kerneltest.RequireRoot(t)
	d := newDataplane(t, testConfig(t))
	r := d.Probe()
	for _, c := range r.Classes {
		if c.Class == backend.ClassFSScope && c.Level != backend.RevocableInKernel {
			t.Skipf("fs.scope is %s here, not BPF LSM (%s); .ci/vmtest runs this test on a kernel with BPF LSM", c.Level, r.Facts["fs_lsm"])
		}
	}
	return d
}

// lsmTree makes the tree the LSM tests grant parts of: every directory
// 0777 and file 0666, so the session's uid (nobody) passes the file
// permissions everywhere and each refusal is the LSM's.
func lsmTree(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "shinken-lsm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	deep := "repo"
	for i := 1; i <= 16; i++ {
		deep = filepath.Join(deep, "d")
	}
	for _, f := range []string{"repo/f", "repo/a/f", "repo/a/b/f", "repo/cred/key", "other/f", "other/g", "ro/f", "x/f", deep + "/f"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("data\n"), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			os.Chmod(p, map[bool]os.FileMode{true: 0o777, false: 0o666}[fi.IsDir()]) // past the umask
		}
		return err
	})
	return root
}

// want runs one probe command and checks its answer: "ok" or "err ERRNO".
func want(t *testing.T, p *probe.Proc, what, cmd, answer string) {
	t.Helper()
	if got := p.Do(cmd); got != answer {
		t.Errorf("%s (%s): %q, want %q", what, cmd, got, answer)
	} else {
		t.Logf("verified: %s: %s", what, answer)
	}
}

func lsmGrant(t *testing.T, d *Dataplane, session string, parent HandleRef, entries ...backend.FileEntry) HandleRef {
	t.Helper()
	h, err := d.NewHandle(parent, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range entries {
		entries[i].Handle = h
	}
	if err := d.Apply(session, backend.Delta{Files: entries}); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestFileScopeLSM: fs.scope enforced by the BPF LSM programs, through a
// probe process inside the session (the test binary, as nobody): reads,
// writes, creates and deletes inside and outside the granted roots; the
// nested write/deny/write case; symbolic link, "..", hard link and rename
// escapes; the walk's depth bound; another session's grant; a deny on a
// path that does not exist (accepted, denies from the next apply once the
// path is made); a revoke that
// is one handle write (counted, no view sweep) and stops both the next open
// and a descriptor opened before it; denials counted and reported with
// class fs.scope.
func TestFileScopeLSM(t *testing.T) {
	d := lsmDataplane(t)
	root := lsmTree(t)
	at := func(p string) string { return filepath.Join(root, p) }
	sa, err := d.CreateSession("lsma", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.CreateSession("lsmb", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := d.CreateSession("lsmc", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()

	// A credential location under a grant (as the boundary's list would
	// name ~/.ssh under a home).
	d.mu.Lock()
	d.lsm.never = append(d.lsm.never, at("repo/cred"))
	d.mu.Unlock()

	// Session a: /repo read, write, delete with /repo/a denied (one grant),
	// /repo/a/b read and write (another), /ro read.
	h1 := lsmGrant(t, d, "lsma", HandleRef{},
		backend.FileEntry{Path: at("repo"), Access: backend.FileRead},
		backend.FileEntry{Path: at("repo"), Access: backend.FileWrite},
		backend.FileEntry{Path: at("repo"), Access: backend.FileDelete},
		backend.FileEntry{Path: at("repo/a"), Access: backend.FileDeny},
		backend.FileEntry{Path: at("ro"), Access: backend.FileRead})
	h2 := lsmGrant(t, d, "lsma", HandleRef{},
		backend.FileEntry{Path: at("repo/a/b"), Access: backend.FileRead},
		backend.FileEntry{Path: at("repo/a/b"), Access: backend.FileWrite})
	// Session b: /other read and write.
	hb := lsmGrant(t, d, "lsmb", HandleRef{},
		backend.FileEntry{Path: at("other"), Access: backend.FileRead},
		backend.FileEntry{Path: at("other"), Access: backend.FileWrite})
	if n := d.FSInodeEntries("lsma"); n != 5 {
		t.Errorf("session a holds %d inode entries, want 5 (repo, repo/a, repo/a/b, repo/cred, ro)", n)
	}

	// wantWhy: refused, and counted under reason r for session a.
	wantWhy := func(t *testing.T, p *probe.Proc, what, cmd string, r Reason) {
		t.Helper()
		before, err := d.Counters(sa.Index)
		if err != nil {
			t.Fatal(err)
		}
		want(t, p, what, cmd, "err EACCES")
		after, err := d.Counters(sa.Index)
		if err != nil {
			t.Fatal(err)
		}
		if after[r] == before[r] {
			t.Errorf("%s: no %s denial counted (before %v, after %v)", what, r, before, after)
		}
	}
	pa := startProbe(t, sa, ProcOptions{})
	pb := startProbe(t, sb, ProcOptions{})
	pc := startProbe(t, sc, ProcOptions{})
	const refused = "err EACCES"

	// Inside and outside.
	want(t, pa, "read inside a write root", "cat "+at("repo/f"), "ok")
	want(t, pa, "write inside", "put "+at("repo/f"), "ok")
	want(t, pa, "create inside", "put "+at("repo/new"), "ok")
	want(t, pa, "mkdir inside", "mkdir "+at("repo/e"), "ok")
	want(t, pa, "rmdir inside", "rmdir "+at("repo/e"), "ok")
	want(t, pa, "rename inside", "rename "+at("repo/new")+" "+at("repo/new2"), "ok")
	want(t, pa, "unlink inside", "unlink "+at("repo/new2"), "ok")
	wantWhy(t, pa, "write outside every root", "put "+at("x/f"), ReasonFSOutside)
	want(t, pa, "append outside", "append "+at("x/f"), refused)
	want(t, pa, "create outside", "put "+at("x/new"), refused)
	want(t, pa, "mkdir outside", "mkdir "+at("x/e"), refused)
	want(t, pa, "truncate outside", "truncate "+at("x/f"), refused)
	want(t, pa, "unlink outside", "unlink "+at("x/f"), refused)
	want(t, pa, "read outside (no view here: reads outside are not refused)", "cat "+at("x/f"), "ok")
	wantWhy(t, pa, "write under a read-only root", "put "+at("ro/f"), ReasonFSDenied)
	want(t, pa, "unlink under a read-only root", "unlink "+at("ro/f"), refused)
	want(t, pa, "read under a read-only root", "cat "+at("ro/f"), "ok")

	// Nested write / deny / write.
	wantWhy(t, pa, "read under the deny", "cat "+at("repo/a/f"), ReasonFSDenied)
	want(t, pa, "write under the deny", "put "+at("repo/a/f"), refused)
	want(t, pa, "create under the deny", "put "+at("repo/a/new"), refused)
	want(t, pa, "unlink under the deny", "unlink "+at("repo/a/f"), refused)
	want(t, pa, "read in the write root under the deny", "cat "+at("repo/a/b/f"), "ok")
	want(t, pa, "write in the write root under the deny", "put "+at("repo/a/b/f"), "ok")
	want(t, pa, "delete in a root without delete", "unlink "+at("repo/a/b/f"), refused)

	// A credential location under a broad grant.
	wantWhy(t, pa, "read a credential under the write root", "cat "+at("repo/cred/key"), ReasonFSDenied)
	want(t, pa, "write it", "put "+at("repo/cred/key"), refused)
	want(t, pa, "delete it", "unlink "+at("repo/cred/key"), refused)
	want(t, pa, "rename the credential directory away", "rename "+at("repo/cred")+" "+at("repo/c2"), refused)

	// Escapes.
	want(t, pa, "symlink into the deny, made in the write root", "symlink "+at("repo/a/f")+" "+at("repo/ln"), "ok")
	want(t, pa, "read through it", "cat "+at("repo/ln"), refused)
	want(t, pa, "symlink to outside", "symlink "+at("x/f")+" "+at("repo/ln2"), "ok")
	want(t, pa, "write through it", "put "+at("repo/ln2"), refused)
	want(t, pa, "dot-dot into the deny", "cat "+at("repo/a/b/../f"), refused)
	want(t, pa, "dot-dot out of the roots", "put "+at("repo/a/b/../../../x/f"), refused)
	wantWhy(t, pa, "hard link of an outside file into the write root", "link "+at("x/f")+" "+at("repo/hl"), ReasonFSOutside)
	want(t, pa, "hard link of a denied file into the write root", "link "+at("repo/a/f")+" "+at("repo/hl"), refused)
	want(t, pa, "rename the denied directory away", "rename "+at("repo/a")+" "+at("repo/z"), refused)
	want(t, pa, "rename a file out of the roots", "rename "+at("repo/f")+" "+at("x/f2"), refused)
	want(t, pa, "rename an outside file in", "rename "+at("x/f")+" "+at("repo/f3"), refused)
	want(t, pa, "rename over a denied file", "rename "+at("repo/f")+" "+at("repo/a/f"), refused)
	want(t, pa, "rename the granted root itself out", "rename "+at("repo")+" "+at("repo2"), refused)
	// A rename inside the roots moves the inode: the walk sees the new place.
	want(t, pa, "move a new directory under the nested write root", "mkdir "+at("repo/m"), "ok")
	want(t, pa, "(a file in it)", "put "+at("repo/m/f"), "ok")
	want(t, pa, "(moved)", "rename "+at("repo/m")+" "+at("repo/a/b/m"), "ok")
	want(t, pa, "delete in its new place (no delete there)", "unlink "+at("repo/a/b/m/f"), refused)

	// The walk's bound: 16 dentries, the object's own first. A file 14
	// directories below the root still finds it (the root is the 16th
	// dentry); 15 below, the root would be the 17th: refused.
	deep := at("repo")
	for i := 1; i <= 14; i++ {
		deep = filepath.Join(deep, "d")
	}
	want(t, pa, "a file 14 directories below the root", "put "+filepath.Join(deep, "new"), "ok")
	wantWhy(t, pa, "a file 15 directories below the root", "put "+filepath.Join(deep, "d", "new"), ReasonFSDepth)

	// Another session's grant does not help; a session without entries is
	// not checked.
	want(t, pa, "session a writes b's root", "put "+at("other/f"), refused)
	want(t, pb, "session b writes its root", "put "+at("other/f"), "ok")
	want(t, pb, "session b writes a's root", "put "+at("repo/f"), refused)
	want(t, pc, "a session without file entries", "put "+at("x/f"), "ok")

	// A deny on a path that does not exist denies nothing that exists and
	// is accepted (as the mount view accepts and skips it); a path made
	// at that name is not denied until the session's entries are next
	// applied (the limit the threat model states for both mechanisms).
	// A deny takes only its own grant's rights (FileRightsView, the view):
	// b's first grant, which gives /other read and write, is revoked
	// first, else it would still give /other/later.
	if err := d.Revoke(hb); err != nil {
		t.Fatal(err)
	}
	lsmGrant(t, d, "lsmb", HandleRef{}, backend.FileEntry{Path: at("other"), Access: backend.FileRead},
		backend.FileEntry{Path: at("other"), Access: backend.FileWrite},
		backend.FileEntry{Path: at("other/later"), Access: backend.FileDeny})
	if n := d.FSInodeEntries("lsmb"); n != 1 {
		t.Errorf("session b holds %d inode entries after a deny on a missing path, want 1 (other)", n)
	}
	want(t, pb, "a deny on a missing path: the root beside it", "put "+at("other/f"), "ok")
	want(t, pb, "made at the denied name before the next apply", "put "+at("other/later"), "ok")
	lsmGrant(t, d, "lsmb", HandleRef{}, backend.FileEntry{Path: at("ro"), Access: backend.FileRead})
	want(t, pb, "the name made, after the next apply", "cat "+at("other/later"), refused)

	// An agent that starts again adopts the pinned maps and links: the
	// entries are restored from the file table with no moment without
	// them, and the old links are replaced by its own.
	d2, err := Open(d.Config())
	if err != nil {
		t.Fatal(err)
	}
	if !d2.lsmOn() || d2.FSInodeEntries("lsma") != 4 {
		t.Errorf("adopted: LSM on %v (%v), %d inode entries of session a, want 4 (its credential list is the default one)", d2.lsmOn(), d2.lsm.err, d2.FSInodeEntries("lsma"))
	}
	if err := d2.Close(); err != nil {
		t.Fatal(err)
	}
	want(t, pa, "after an adopting agent closed: the write root", "put "+at("repo/a/b/f"), "ok")
	want(t, pa, "after an adopting agent closed: the deny", "cat "+at("repo/a/f"), refused)

	// Revoke: one handle write, no view sweep; the next open fails, and so
	// do reads and writes on a descriptor opened before.
	want(t, pa, "open before the revoke", "fopen keep "+at("repo/a/b/f")+" rw", "ok")
	want(t, pa, "read on it", "fread keep", "ok")
	want(t, pa, "write on it", "fwrite keep", "ok")
	want(t, pa, "a descriptor under the other grant", "fopen other "+at("repo/f")+" rw", "ok")
	if revokeCounted(t, d, h2, 0) {
		t.Logf("verified: revoke is one handle write, no view sweep")
	}
	wantWhy(t, pa, "read on the descriptor after the revoke", "fread keep", ReasonFSDenied)
	want(t, pa, "write on the descriptor after the revoke", "fwrite keep", refused)
	want(t, pa, "open after the revoke (the deny above decides now)", "cat "+at("repo/a/b/f"), refused)
	want(t, pa, "the other grant's descriptor still reads", "fread other", "ok")
	want(t, pa, "and writes", "fwrite other", "ok")
	if err := d.Revoke(h1); err != nil {
		t.Fatal(err)
	}
	wantWhy(t, pa, "write on the other descriptor after its revoke", "fwrite other", ReasonHandleRevoked)
	want(t, pa, "create in the revoked root", "put "+at("repo/new3"), refused)

	// Counted per session and reason, and reported with class fs.scope.
	cnt, err := d.Counters(sa.Index)
	if err != nil {
		t.Fatal(err)
	}
	if cnt[ReasonFSOutside] == 0 || cnt[ReasonFSDenied] == 0 || cnt[ReasonFSDepth] == 0 || cnt[ReasonHandleRevoked] == 0 {
		t.Errorf("session a's counters: outside %d, denied %d, depth %d, handle_revoked %d: want each > 0", cnt[ReasonFSOutside], cnt[ReasonFSDenied], cnt[ReasonFSDepth], cnt[ReasonHandleRevoked])
	}
	ev.SetDeadline(time.Now().Add(2 * time.Second))
	seen := map[Reason]bool{}
	for {
		e, err := ev.Read()
		if err != nil {
			break
		}
		if e.Session == sa.Index && e.Reason.Class() == backend.ClassFSScope {
			seen[e.Reason] = true
			if e.Inode == 0 || e.Dev == 0 || e.Access == 0 || e.Dst.IsValid() {
				t.Errorf("fs.scope event without its inode and access, or with a destination: %+v", e)
			}
		}
	}
	if !seen[ReasonFSOutside] || !seen[ReasonFSDenied] {
		t.Errorf("fs.scope events of session a: %v, want fs_outside and fs_denied", seen)
	}
	for _, r := range []Reason{ReasonFSOutside, ReasonFSDenied, ReasonFSDepth} {
		if r.Class() != backend.ClassFSScope || !strings.HasPrefix(r.String(), "fs_") {
			t.Errorf("reason %d: class %s, name %s", r, r.Class(), r)
		}
	}

	// Session destroyed: its inode entries go.
	if err := d.DestroySession("lsma"); err != nil {
		t.Fatal(err)
	}
	if n := d.FSInodeEntries("lsma"); n != 0 {
		t.Errorf("after destroy: %d inode entries", n)
	}
}

// TestFileScopeLSMProbe: the probe claims BPF LSM for fs.scope exactly
// when every LSM program is attached and pinned (links/lsm_*), and says
// why not otherwise; a load that failed leaves no LSM link behind.
func TestFileScopeLSMProbe(t *testing.T) {
	kerneltest.RequireRoot(t)
	d := newDataplane(t, testConfig(t))
	r := d.Probe()
	var row backend.Strength
	for _, c := range r.Classes {
		if c.Class == backend.ClassFSScope {
			row = c
		}
	}
	// fs.scope's own links (the exec gate's, where it is attached too, is
	// pinned beside them).
	var pins []string
	for _, h := range fsLSMHooks {
		p := filepath.Join(d.Config().PinPath, "links", h.name)
		if _, err := os.Stat(p); err == nil {
			pins = append(pins, p)
		}
	}
	fact := r.Facts["fs_lsm"]
	if d.lsmOn() {
		if row.Level != backend.RevocableInKernel || !strings.Contains(row.Mechanism, "file_permission") || len(pins) != len(fsLSMHooks) || !strings.HasPrefix(fact, "attached") {
			t.Errorf("attached, but row %s (%.60s), %d pinned links, fact %q", row.Level, row.Mechanism, len(pins), fact)
		}
		t.Logf("verified: BPF LSM attached, %d links pinned, row %s", len(pins), row.Level)
		return
	}
	if row.Level == backend.RevocableInKernel || strings.Contains(row.Mechanism, "BPF LSM (") || len(pins) != 0 || !strings.HasPrefix(fact, "not attached: ") || len(fact) < len("not attached: ")+10 {
		t.Errorf("not attached, but row %s (%.60s), %d pinned links, fact %q", row.Level, row.Mechanism, len(pins), fact)
	}
	t.Logf("verified: not attached (%s); fs.scope row %s", fact, row.Level)
}
