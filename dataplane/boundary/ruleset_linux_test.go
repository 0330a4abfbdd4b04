package boundary

import (
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
)

// rulesetFixture: a session "rs" whose only protection of cred is the
// Landlock baseline (world-readable, the host's read-only root in the view,
// no mask), and open beside it (a rule of the hierarchy).
func rulesetFixture(t *testing.T) (b *Boundary, cred, open string) {
	t.Helper()
	setup(t)
	dir, err := os.MkdirTemp(helperDir, "rs-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	cred, open = filepath.Join(dir, "state"), filepath.Join(dir, "open")
	for _, d := range []string{cred, open} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(cred, "secret"), []byte("CRED-SECRET\n"), 0o644)
	os.WriteFile(filepath.Join(open, "ok"), []byte("OPEN-OK\n"), 0o644)
	b = newBoundary(t, Config{FileNever: []string{cred}}, nil)
	if !b.useLandlockFS {
		t.Skip("no Landlock baseline on this host")
	}
	session(t, b, "rs", 71)
	// Past the hierarchy's racy window: rules built from a directory
	// changed this recently are built again at each launch.
	time.Sleep(2 * racyWindow)
	return b, cred, open
}

// TestRulesetBuiltOnce (issue 20): a session's Landlock baseline is built
// once and entered by each later launch (no build per launch), and it is
// rebuilt after a change of the session's view.
func TestRulesetBuiltOnce(t *testing.T) {
	b, cred, open := rulesetFixture(t)
	for i := 0; i < 3; i++ {
		if out, ok := inSession(t, b, "rs", "/", "cat "+open+"/ok; cat "+cred+"/secret"); !strings.Contains(out, "OPEN-OK") || ok || strings.Contains(out, "CRED-SECRET") {
			t.Fatalf("launch %d: ok %v, output %q (want the sibling read, the credential denied)", i, ok, out)
		}
	}
	if n := b.rulesets.builds.Load(); n != 1 {
		t.Errorf("3 launches built %d rulesets, want 1", n)
	}
	if err := b.SetFiles("rs", []backend.FileEntry{{Path: open, Access: backend.FileDeny, Handle: backend.HandleRef{Slot: 1, Generation: 1}}}, []string{cred}); err != nil {
		t.Fatal(err)
	}
	inSession(t, b, "rs", "/", "true")
	if n := b.rulesets.builds.Load(); n != 2 {
		t.Errorf("a launch after a view change: %d rulesets built in all, want 2", n)
	}
}

// TestRulesetRevokeNarrows (issue 20): after an admin override that opened
// a credential location is revoked, the next launch's domain denies it
// again. Here nothing but Landlock denies it (the view shows the host's
// read-only root there, the same inode the override's mount showed), so a
// launch that entered the ruleset cached while the override was in force
// would read it.
func TestRulesetRevokeNarrows(t *testing.T) {
	b, cred, _ := rulesetFixture(t)
	never := []string{cred}
	on := backend.FileEntry{Path: cred, Access: backend.FileRead, Handle: backend.HandleRef{Slot: 1, Generation: 1}, Override: true}
	if err := b.SetFiles("rs", []backend.FileEntry{on}, never); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // the second launch enters the cached ruleset
		if out, ok := inSession(t, b, "rs", "/", "cat "+cred+"/secret"); !ok || !strings.Contains(out, "CRED-SECRET") {
			t.Fatalf("with the override, launch %d: ok %v, %q", i, ok, out)
		}
	}
	if err := b.SetFiles("rs", nil, never); err != nil {
		t.Fatal(err)
	}
	if out, ok := inSession(t, b, "rs", "/", "cat "+cred+"/secret"); ok || strings.Contains(out, "CRED-SECRET") {
		t.Errorf("a launch after the override was revoked read the credential (stale ruleset): %q", out)
	}
}

// TestRulesetViewChange (issue 20): a ruleset names the inodes its paths
// showed in the session's view when it was built. A deny mask over a rule
// path, then taken away: a launch after that must be built from the
// view as it is (the path readable again), not enter the ruleset built
// over the mask (whose root inode is gone from the view: EACCES). The key
// (hierarchy, view rules) does not change here, so only the drop at every
// view change makes this pass.
func TestRulesetViewChange(t *testing.T) {
	b, cred, open := rulesetFixture(t)
	never := []string{cred}
	if err := b.SetFiles("rs", []backend.FileEntry{{Path: open, Access: backend.FileDeny, Handle: backend.HandleRef{Slot: 1, Generation: 1}}}, never); err != nil {
		t.Fatal(err)
	}
	if out, ok := inSession(t, b, "rs", "/", "cat "+open+"/ok"); ok || strings.Contains(out, "OPEN-OK") {
		t.Fatalf("under the deny: %v %q", ok, out)
	}
	if err := b.SetFiles("rs", nil, never); err != nil {
		t.Fatal(err)
	}
	if out, ok := inSession(t, b, "rs", "/", "cat "+open+"/ok"); !ok || !strings.Contains(out, "OPEN-OK") {
		t.Errorf("after the deny went: ok %v, %q (a ruleset built over the mask?)", ok, out)
	}
}

// TestRulesetNotInherited (issue 20): the session's ruleset never reaches a
// session process, through Launch or through Prepare and StartPrepared (the
// shim's path): no descriptor of the launched program is a Landlock
// ruleset (the attacker with the ruleset's descriptor adds a rule for / to
// it, and every later launch of the session enters it).
func TestRulesetNotInherited(t *testing.T) {
	b, _, _ := rulesetFixture(t)
	const list = `for f in /proc/self/fd/*; do echo "$f $(readlink $f)"; done`
	check := func(how, out string) {
		t.Helper()
		if !strings.Contains(out, "/proc/self/fd/1 ") {
			t.Fatalf("%s: no descriptor list: %q", how, out)
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.Contains(l, "landlock") || strings.Contains(l, "anon_inode") {
				t.Errorf("%s: the session process holds %s", how, l)
			}
		}
		t.Logf("%s: %s", how, strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
	}
	for i := 0; i < 2; i++ { // built, then cached
		out, ok := inSession(t, b, "rs", "/", list)
		if !ok {
			t.Fatalf("launch: %q", out)
		}
		check("Launch", out)
	}
	for i := 0; i < 2; i++ {
		pl, err := b.Prepare("rs", backend.LaunchSpec{Argv: []string{"/bin/sh", "-c", list}, Env: []string{"PATH=/usr/bin:/bin"}}, LaunchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		null, _ := os.Open(os.DevNull)
		st, err := StartPrepared(backend.StartRequest{Args: pl.Args, Files: pl.Files, Stdin: null, Stdout: w, Stderr: w})
		w.Close()
		null.Close()
		pl.Close(err != nil)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(r)
		r.Close()
		ps, _ := st.Process.Wait()
		if !ps.Success() {
			t.Fatalf("prepared launch: %v %q", ps, out)
		}
		check("Prepare+StartPrepared", string(out))
	}
	if n := b.rulesets.builds.Load(); n != 1 {
		t.Errorf("4 launches built %d rulesets, want 1", n)
	}
}

// TestRulesetOpenedAsSession (issue 20): the agent opens the rules with the
// session's uid and no capability, as the launcher did: a rule beneath a
// directory the session's uid cannot search (root's, 0700, holding a
// credential location, so descended) fails the launch with EACCES, as it
// did in the launcher; opened with the agent's root it would succeed.
func TestRulesetOpenedAsSession(t *testing.T) {
	setup(t)
	dir, err := os.MkdirTemp(helperDir, "rsu-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	priv := filepath.Join(dir, "priv")
	if err := os.MkdirAll(filepath.Join(priv, "cred"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(priv, "other"), 0o755)
	b := newBoundary(t, Config{FileNever: []string{filepath.Join(priv, "cred")}}, nil)
	if !b.useLandlockFS {
		t.Skip("no Landlock baseline on this host")
	}
	session(t, b, "rsu", 73)
	cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Dir: "/"}
	err = b.Launch("rsu", cmd, LaunchOptions{}, false)
	if err == nil {
		cmd.Wait()
		t.Fatalf("a launch whose rules lie beneath a directory the session cannot search started (rules opened with the agent's privileges)")
	}
	if !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), filepath.Join(priv, "other")) {
		t.Errorf("launch error %v: want EACCES opening %s", err, filepath.Join(priv, "other"))
	}
}

// TestRulesetCacheGenerations (issue 20, no root): a build that overlapped
// a drop is not kept; a ruleset is handed out only for its own key and
// generation, as a duplicate; a released session keeps nothing; at most
// maxRulesets are kept, the least recently used going first.
func TestRulesetCacheGenerations(t *testing.T) {
	var c rulesetCache
	devnull := func() int {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		fd, _ := syscall.Dup(int(f.Fd()))
		f.Close()
		return fd
	}
	if fd, _, known := c.get("s", "k"); fd >= 0 || known {
		t.Fatalf("an unknown session: fd %d known %v", fd, known)
	}
	c.drop("s", false) // Create
	_, gen, _ := c.get("s", "k")
	c.drop("s", false) // a view change while the build ran
	fd := devnull()
	if got := c.put("s", "k", gen, fd); got != fd {
		t.Errorf("a build that overlapped a drop was kept")
	}
	syscall.Close(fd)
	_, gen, _ = c.get("s", "k")
	fd = devnull()
	dup := c.put("s", "k", gen, fd)
	if dup == fd {
		t.Fatalf("a build under the current generation was not kept")
	}
	syscall.Close(dup)
	if got, _, _ := c.get("s", "other key"); got >= 0 {
		t.Errorf("a ruleset handed out for another key")
	}
	got, _, _ := c.get("s", "k")
	if got < 0 || got == fd {
		t.Fatalf("the kept ruleset: got %d (kept %d): want a duplicate", got, fd)
	}
	syscall.Close(got)
	c.drop("s", true) // Release
	if got, _, known := c.get("s", "k"); got >= 0 || known {
		t.Errorf("a released session's ruleset: fd %d known %v", got, known)
	}
	if err := syscall.Close(fd); err == nil {
		t.Errorf("the released ruleset's descriptor was still open")
	}
	for i := 0; i <= maxRulesets; i++ {
		n := "s" + strconv.Itoa(i)
		c.drop(n, false)
		_, g, _ := c.get(n, "k")
		syscall.Close(c.put(n, "k", g, devnull()))
		if i == 0 {
			continue
		}
		if got, _, _ := c.get("s0", "k"); got >= 0 { // s0 the most recently used
			syscall.Close(got)
		}
	}
	if len(c.sets) != maxRulesets {
		t.Errorf("%d rulesets kept, want at most %d", len(c.sets), maxRulesets)
	}
	if c.sets["s0"] == nil || c.sets["s1"] != nil {
		t.Errorf("eviction: s0 (used) kept %v, s1 (least recently used) dropped %v", c.sets["s0"] != nil, c.sets["s1"] == nil)
	}
	for n := range c.sets {
		c.drop(n, true)
	}
}
