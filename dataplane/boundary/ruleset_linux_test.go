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
	b, cred, open = rulesetFiles(t)
	session(t, b, "rs", 71)
	// Past the hierarchy's racy window: rules built from a directory
	// changed this recently are built again at each launch.
	time.Sleep(2 * racyWindow)
	// A create queues no prebuild (no holder: issue 21); should one run
	// (a holder started by another operation), wait for it and drop what
	// it kept, and the tests count their launches' builds from one known
	// start.
	waitPrebuilt(t, b, 0)
	b.rulesets.drop("rs", false)
	return b, cred, open
}

// rulesetFiles is rulesetFixture's boundary and directories, no session.
func rulesetFiles(t *testing.T) (b *Boundary, cred, open string) {
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
	return b, cred, open
}

// waitPrebuilt waits (5 s at most) until b has prebuilt n rulesets and its
// prebuild goroutine has stopped.
func waitPrebuilt(t *testing.T, b *Boundary, n uint64) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b.rulesets.mu.Lock()
		idle := !b.rulesets.building
		b.rulesets.mu.Unlock()
		if idle && b.rulesets.prebuilds.Load() >= n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d rulesets prebuilt after 5 s (building %v), want %d", b.rulesets.prebuilds.Load(), !idle, n)
		}
	}
}

// hierarchyGen is the count of the hierarchy's rule builds so far.
func hierarchyGen(b *Boundary) uint64 {
	b.llTree.mu.Lock()
	defer b.llTree.mu.Unlock()
	return b.llTree.gen
}

// checkBuilds: the launches since gen0 (hierarchyGen) built want rulesets,
// plus at most one for each rebuild of the hierarchy since gen0: another
// process on the host (a parallel test package) that writes in an ancestor
// of a credential location (/var/tmp) changes the rules, and the next
// launch builds again, as it must. On a quiet host the count is exact.
func checkBuilds(t *testing.T, b *Boundary, gen0, want uint64, what string) {
	t.Helper()
	n, extra := b.rulesets.builds.Load(), hierarchyGen(b)-gen0
	if n < want || n > want+extra {
		t.Errorf("%s: %d rulesets built, want %d (the hierarchy was rebuilt %d times meanwhile)", what, n, want, extra)
	} else if extra > 0 {
		t.Logf("%s: %d rulesets built, %d wanted; the hierarchy was rebuilt %d times meanwhile (a change in an ancestor directory)", what, n, want, extra)
	}
}

// TestRulesetPrebuilt (issue 20): a session's ruleset is built ahead, in
// the background, when its holder starts for an operation that is not a
// launch (here a file get; Create starts no holder, issue 21, and so
// builds nothing), so that its first launch enters it and builds nothing;
// the first launch still gets the baseline (the sibling read, the
// credential denied).
func TestRulesetPrebuilt(t *testing.T) {
	b, cred, open := rulesetFiles(t)
	time.Sleep(2 * racyWindow) // the hierarchy settled before the create
	session(t, b, "rs", 71)
	waitPrebuilt(t, b, 0)
	if n := b.rulesets.prebuilds.Load(); n != 0 {
		t.Errorf("after create: %d rulesets prebuilt, want none (no holder to build in)", n)
	}
	f, err := b.OpenFile("rs", open, "ok")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	waitPrebuilt(t, b, 1)
	gen0 := hierarchyGen(b) // the prebuild's
	if out, ok := inSession(t, b, "rs", "/", "cat "+open+"/ok; cat "+cred+"/secret"); !strings.Contains(out, "OPEN-OK") || ok || strings.Contains(out, "CRED-SECRET") {
		t.Fatalf("first launch: ok %v, output %q (want the sibling read, the credential denied)", ok, out)
	}
	checkBuilds(t, b, gen0, 0, "the first launch (prebuilt at create)")
	// A view change drops the prebuilt ruleset: the next launch builds.
	if err := b.SetFiles("rs", []backend.FileEntry{{Path: open, Access: backend.FileDeny, Handle: backend.HandleRef{Slot: 1, Generation: 1}}}, []string{cred}); err != nil {
		t.Fatal(err)
	}
	if out, _ := inSession(t, b, "rs", "/", "cat "+open+"/ok"); strings.Contains(out, "OPEN-OK") {
		t.Errorf("after the view denied %s: read it: %q", open, out)
	}
	checkBuilds(t, b, gen0, 1, "a launch after a view change")
}

// TestRulesetPrebuildReleased (issue 20): a session released while its
// prebuild is queued or under way keeps nothing: no ruleset cached, no
// descriptor left, and a session of the same name made afterwards gets
// its own.
func TestRulesetPrebuildReleased(t *testing.T) {
	b, _, _ := rulesetFiles(t)
	before := countFDs(t)
	for i := 0; i < 5; i++ {
		dir := session(t, b, "rel", 72)
		// A file get starts the holder and queues its prebuild (issue 21).
		if f, err := b.OpenFile("rel", "/etc", "hostname"); err == nil {
			f.Close()
		}
		os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		b.Release("rel")
		removeCgroupTree(dir)
	}
	waitPrebuilt(t, b, 0)
	b.rulesets.mu.Lock()
	n, queued := len(b.rulesets.sets), len(b.rulesets.queue)
	b.rulesets.mu.Unlock()
	if n != 0 || queued != 0 {
		t.Errorf("after Release: %d rulesets kept, %d sessions queued, want none", n, queued)
	}
	if after := countFDs(t); after > before {
		t.Errorf("descriptors: %d before, %d after the released sessions' prebuilds", before, after)
	}
}

// TestRulesetBuiltOnce (issue 20): a session's Landlock baseline is built
// once and entered by each later launch (no build per launch), and it is
// rebuilt after a change of the session's view.
func TestRulesetBuiltOnce(t *testing.T) {
	b, cred, open := rulesetFixture(t)
	gen0 := hierarchyGen(b)
	for i := 0; i < 3; i++ {
		if out, ok := inSession(t, b, "rs", "/", "cat "+open+"/ok; cat "+cred+"/secret"); !strings.Contains(out, "OPEN-OK") || ok || strings.Contains(out, "CRED-SECRET") {
			t.Fatalf("launch %d: ok %v, output %q (want the sibling read, the credential denied)", i, ok, out)
		}
	}
	checkBuilds(t, b, gen0, 1, "3 launches")
	if err := b.SetFiles("rs", []backend.FileEntry{{Path: open, Access: backend.FileDeny, Handle: backend.HandleRef{Slot: 1, Generation: 1}}}, []string{cred}); err != nil {
		t.Fatal(err)
	}
	inSession(t, b, "rs", "/", "true")
	checkBuilds(t, b, gen0, 2, "3 launches and one after a view change")
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
	gen0 := hierarchyGen(b)
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
	checkBuilds(t, b, gen0, 1, "4 launches")
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
	if got := c.put("s", "k", gen, fd, false); got != fd {
		t.Errorf("a build that overlapped a drop was kept")
	}
	syscall.Close(fd)
	_, gen, _ = c.get("s", "k")
	fd = devnull()
	dup := c.put("s", "k", gen, fd, false)
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
		syscall.Close(c.put(n, "k", g, devnull(), false))
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

// TestRulesetPrebuildNoChurn (issue 20, no root): a prebuilt ruleset is
// the first to go when a launch's build needs room; a prebuild never
// replaces one that no launch has used yet (a burst of creates builds at
// most maxRulesets ahead), but does replace the least recently used of
// those launches used.
func TestRulesetPrebuildNoChurn(t *testing.T) {
	var c rulesetCache
	devnull := func() int {
		fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	add := func(n string, pre bool) bool {
		c.drop(n, false)
		_, g, _ := c.get(n, "k")
		fd := devnull()
		got := c.put(n, "k", g, fd, pre)
		syscall.Close(got)
		return got != fd
	}
	t.Cleanup(func() {
		for n := range c.sets {
			c.drop(n, true)
		}
	})
	if !add("used", false) {
		t.Fatal("a launch's build was not kept")
	}
	for i := 1; i < maxRulesets; i++ {
		if !add("p"+strconv.Itoa(i), true) {
			t.Fatalf("prebuild %d not kept with room left", i)
		}
	}
	// Full: one used ruleset, the rest prebuilt and never used.
	if !c.roomFor("late") || !add("late", true) {
		t.Fatal("a prebuild in a full cache did not replace the ruleset a launch used")
	}
	if c.sets["used"] != nil {
		t.Error("the used ruleset was kept, the prebuild replaced another")
	}
	if c.roomFor("later") || add("later", true) {
		t.Error("a prebuild replaced one no launch has used yet")
	}
	if len(c.sets) != maxRulesets {
		t.Errorf("%d rulesets kept, want %d", len(c.sets), maxRulesets)
	}
	// A launch's build makes room by dropping a prebuilt one, not p1 once
	// a launch has entered it.
	if fd, _, _ := c.get("p1", "k"); fd < 0 {
		t.Fatal("the prebuilt ruleset p1 was not handed out")
	} else {
		syscall.Close(fd)
	}
	if !add("launched", false) {
		t.Fatal("a launch's build in a full cache was not kept")
	}
	if c.sets["p1"] == nil {
		t.Error("the launch's build replaced p1, which a launch used, before a prebuilt one never used")
	}
	if len(c.sets) != maxRulesets {
		t.Errorf("%d rulesets kept, want %d", len(c.sets), maxRulesets)
	}
}
