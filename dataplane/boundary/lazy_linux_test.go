package boundary

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// startHolderIn starts session name's holder the way the product does: a
// launch (of /bin/true) into it.
func startHolderIn(t *testing.T, b *Boundary, name string) {
	t.Helper()
	runIn(t, b, name, &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Dir: "/"}, true)
}

// cgroupProcs is the pids of cgroup dir and every cgroup below it.
func cgroupProcs(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			data, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			out = append(out, strings.Fields(string(data))...)
		}
		return nil
	})
	return out
}

// TestLazyHolder (issue 21): a new session has no process and no holder
// (an idle session costs no namespace); its first launch starts one
// holder, which later launches share (same pid 1, same PID namespace).
func TestLazyHolder(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	if !b.useNS {
		t.Skip("no session namespaces on this host")
	}
	dir := session(t, b, "lazy", 81)
	if p := cgroupProcs(t, dir); len(p) != 0 {
		t.Errorf("after create: processes %v in the session cgroup, want none", p)
	}
	if run, err := b.HolderRunning("lazy"); err != nil || run {
		t.Errorf("after create: holder running %v (%v), want false", run, err)
	}
	if n := b.HolderStarts(); n != 0 {
		t.Errorf("after create: %d holders started, want 0", n)
	}
	ns := func() string {
		out := runIn(t, b, "lazy", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/1/comm; readlink /proc/self/ns/pid"}, Dir: "/"}, true)
		if f := strings.Fields(out); len(f) != 2 || f[0] != "catatonit" {
			t.Fatalf("inside the session: %q, want catatonit and a PID namespace", out)
		}
		return strings.Fields(out)[1]
	}
	first := ns()
	if run, _ := b.HolderRunning("lazy"); !run {
		t.Error("after the first launch: holder not running")
	}
	if second := ns(); second != first {
		t.Errorf("the second launch is in PID namespace %s, the first in %s: want one holder", second, first)
	}
	if n := b.HolderStarts(); n != 1 {
		t.Errorf("after two launches: %d holders started, want 1", n)
	}
	if p := cgroupProcs(t, dir); len(p) != 1 {
		t.Errorf("after the launches ended: processes %v, want the holder alone", p)
	}
}

// TestLazyHolderRace (issue 21): concurrent first launches into a new
// session start exactly one holder, and every one of them runs in it.
func TestLazyHolderRace(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	if !b.useNS {
		t.Skip("no session namespaces on this host")
	}
	dir := session(t, b, "race", 82)
	const n = 8
	outs := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out strings.Builder
			cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "readlink /proc/self/ns/pid"}, Dir: "/", Stdout: &out, Stderr: &out}
			if err := b.Launch("race", cmd, LaunchOptions{}, true); err != nil {
				outs[i] = "launch: " + err.Error()
				return
			}
			_ = cmd.Wait()
			outs[i] = strings.TrimSpace(out.String())
		}()
	}
	wg.Wait()
	for i, o := range outs {
		if o != outs[0] || !strings.HasPrefix(o, "pid:[") {
			t.Errorf("launch %d: %q, launch 0: %q (want one PID namespace)", i, o, outs[0])
		}
	}
	if got := b.HolderStarts(); got != 1 {
		t.Errorf("%d concurrent first launches started %d holders, want 1", n, got)
	}
	if p := cgroupProcs(t, dir); len(p) != 1 {
		t.Errorf("after the launches: processes %v, want one holder", p)
	}
}

// TestLazyHolderView (issue 21): a grant and a revoke of the view made
// before the session's first launch change no mount and start no holder,
// and they are exactly what the first launch sees: the granted directory
// writable, the revoked one not, the credential location masked.
func TestLazyHolderView(t *testing.T) {
	setup(t)
	dir, err := os.MkdirTemp(helperDir, "lazyview-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	kept, revoked, cred := filepath.Join(dir, "kept"), filepath.Join(dir, "revoked"), filepath.Join(dir, "cred")
	for _, d := range []string{kept, revoked, cred} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(cred, "secret"), []byte("LAZY-SECRET\n"), 0o644)
	b := newBoundary(t, Config{FileNever: []string{cred}}, nil)
	if !b.useNS {
		t.Skip("no session namespaces on this host")
	}
	session(t, b, "lv", 83)
	entry := func(p string, slot uint32) backend.FileEntry {
		return backend.FileEntry{Path: p, Access: backend.FileWrite, Handle: backend.HandleRef{Slot: slot, Generation: 1}}
	}
	never := []string{cred}
	// The grant of both, then the revoke of one (what the sweep sets).
	if err := b.SetFiles("lv", []backend.FileEntry{entry(kept, 1), entry(revoked, 2), {Path: dir, Access: backend.FileRead, Handle: backend.HandleRef{Slot: 3, Generation: 1}}}, never); err != nil {
		t.Fatal(err)
	}
	if err := b.SetFiles("lv", []backend.FileEntry{entry(kept, 1), {Path: dir, Access: backend.FileRead, Handle: backend.HandleRef{Slot: 3, Generation: 1}}}, never); err != nil {
		t.Fatal(err)
	}
	if run, _ := b.HolderRunning("lv"); run || b.HolderStarts() != 0 || b.ViewChanges() != 0 {
		t.Fatalf("view changes before the first launch: holder running %v, %d started, %d mount changes; want none", run, b.HolderStarts(), b.ViewChanges())
	}
	out := runIn(t, b, "lv", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c",
		fmt.Sprintf("echo a > %s/f && echo KEPT-W; echo b > %s/f && echo REVOKED-W; cat %s/secret", kept, revoked, cred)}, Dir: "/"}, true)
	if !strings.Contains(out, "KEPT-W") {
		t.Errorf("first launch: cannot write the granted %s: %q", kept, out)
	}
	if strings.Contains(out, "REVOKED-W") {
		t.Errorf("first launch: wrote the revoked %s: %q", revoked, out)
	}
	if strings.Contains(out, "LAZY-SECRET") {
		t.Errorf("first launch: read the credential location: %q", out)
	}
	if _, err := os.Stat(filepath.Join(revoked, "f")); err == nil {
		t.Errorf("the revoked directory has the session's file")
	}
	// A change after the start changes the holder's mounts.
	if err := b.SetFiles("lv", []backend.FileEntry{{Path: dir, Access: backend.FileRead, Handle: backend.HandleRef{Slot: 3, Generation: 1}}}, never); err != nil {
		t.Fatal(err)
	}
	out = runIn(t, b, "lv", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", fmt.Sprintf("echo c > %s/g && echo KEPT-W", kept)}, Dir: "/"}, true)
	if strings.Contains(out, "KEPT-W") {
		t.Errorf("after the revoke of %s on a started holder: still writable: %q", kept, out)
	}
}

// TestLazyHolderAdopt (issue 21): a restarted agent adopts a session that
// never started a holder (none found: still none, nothing started) and
// one that did; a launch works in both, the first through a new holder.
func TestLazyHolderAdopt(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	if !b.useNS {
		t.Skip("no session namespaces on this host")
	}
	idle := session(t, b, "ai", 84)
	busy := session(t, b, "ab", 85)
	startHolderIn(t, b, "ab")
	b2 := newBoundary(t, Config{}, nil) // the restarted agent
	for name, d := range map[string]string{"ai": idle, "ab": busy} {
		if err := b2.Adopt(name, d, map[string]uint32{"ai": 84, "ab": 85}[name]); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { b2.Release("ai"); b2.Release("ab") })
	if run, _ := b2.HolderRunning("ai"); run || len(cgroupProcs(t, idle)) != 0 {
		t.Errorf("adopted holderless session: running %v, processes %v; want none", run, cgroupProcs(t, idle))
	}
	if run, _ := b2.HolderRunning("ab"); !run {
		t.Error("adopted session with a holder: not running")
	}
	for _, name := range []string{"ai", "ab"} {
		out := runIn(t, b2, name, &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/1/comm"}, Dir: "/"}, true)
		if strings.TrimSpace(out) != "catatonit" {
			t.Errorf("launch into adopted %s: pid 1 %q, want catatonit", name, out)
		}
	}
	if n := b2.HolderStarts(); n != 1 {
		t.Errorf("the restarted agent started %d holders, want 1 (the holderless session's)", n)
	}
}

// TestLazyHolderViewRefused: a view change that the holder's start could
// not lay out (here a write root reached through a symbolic link, which
// the view never mounts) is refused when it is made on a session with no
// holder, as on one with a running holder, and changes nothing: the
// session's first launch sees the view as it was.
func TestLazyHolderViewRefused(t *testing.T) {
	setup(t)
	dir, err := os.MkdirTemp(helperDir, "lazyrefused-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	good, real := filepath.Join(dir, "good"), filepath.Join(dir, "real")
	for _, d := range []string{good, real} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	b := newBoundary(t, Config{}, nil)
	if !b.useNS {
		t.Skip("no session namespaces on this host")
	}
	session(t, b, "lr", 84)
	entry := func(p string, slot uint32) backend.FileEntry {
		return backend.FileEntry{Path: p, Access: backend.FileWrite, Handle: backend.HandleRef{Slot: slot, Generation: 1}}
	}
	if err := b.SetFiles("lr", []backend.FileEntry{entry(good, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	bad := []backend.FileEntry{entry(good, 1), entry(filepath.Join(link, "."), 2)}
	if err := b.SetFiles("lr", bad, nil); err == nil {
		t.Errorf("a write root through a symbolic link, no holder yet: accepted")
	} else {
		t.Logf("refused with no holder: %v", err)
	}
	if run, _ := b.HolderRunning("lr"); run || b.HolderStarts() != 0 {
		t.Fatalf("the refused change started a holder")
	}
	out := runIn(t, b, "lr", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c",
		fmt.Sprintf("echo a > %s/f && echo GOOD-W; echo b > %s/f && echo REAL-W", good, real)}, Dir: "/"}, true)
	if !strings.Contains(out, "GOOD-W") {
		t.Errorf("first launch after the refused change: cannot write the granted %s: %q", good, out)
	}
	if strings.Contains(out, "REAL-W") {
		t.Errorf("first launch after the refused change: wrote %s: %q", real, out)
	}
	// The same change on the running holder: refused the same way.
	if err := b.SetFiles("lr", bad, nil); err == nil {
		t.Errorf("a write root through a symbolic link, running holder: accepted")
	}
}
