package dataplane

import (
	"bufio"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFileScopeCredentialOverride: an admin override (FileEntry.Override,
// which the agent derives from an admin policy: agent/fsoverride.go) on an
// entry naming a credential location opens it in the view and for
// processes launched after it (their Landlock domain gets a rule for it);
// a process launched before keeps its domain, which denies it (fixed at
// exec); an override on a broad entry above the location opens nothing;
// the fixed locations (the agent's own: here root/secret) never open;
// taking the override back (SetFileOverride) closes it at the next open,
// also for a process launched while it was in force.
func TestFileScopeCredentialOverride(t *testing.T) {
	d, r := fsSession(t)
	key := r + "/home/u/.ssh/id_ed25519"
	// A shell started before any override.
	cmd := exec.Command("/bin/sh", "-c", `while read -r line; do eval "$line" >/dev/null 2>&1; echo "RC $?"; done`)
	cmd.Dir = "/"
	in, _ := cmd.StdinPipe()
	outp, _ := cmd.StdoutPipe()
	if err := d.Launch("fs", cmd, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	rd := bufio.NewReader(outp)
	early := func(what, line string, want bool) {
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
	fileGrant(t, d, backend.FileEntry{Path: r, Access: backend.FileRead, Override: true})
	wantSh(t, d, "a broad read grant with an override: the credential", "cat "+key, false)
	wantSh(t, d, "a broad read grant with an override: beside it", "cat "+r+"/home/u/notes", true)
	named := fileGrant(t, d, backend.FileEntry{Path: r + "/home/u/.ssh", Access: backend.FileRead})
	wantSh(t, d, "a grant naming the credential, no override", "cat "+key, false)
	on := backend.FileEntry{Path: r + "/home/u/.ssh", Access: backend.FileRead, Handle: named, Override: true}
	if err := d.SetFileOverride("fs", on); err != nil {
		t.Fatal(err)
	}
	wantSh(t, d, "the named grant with an override: read (a launch after it)", "cat "+key, true)
	wantSh(t, d, "the named grant with an override: list", "ls "+r+"/home/u/.ssh | grep -q id_ed25519", true)
	wantSh(t, d, "the named grant with an override: write (read only)", "echo x >> "+key, false)
	early("a process launched before the override (its Landlock domain denies it)", "cat "+key, false)
	// Launched while the override is in force, kept after it goes.
	cmd2 := exec.Command("/bin/sh", "-c", `read -r x; cat `+key)
	cmd2.Dir = "/"
	in2, _ := cmd2.StdinPipe()
	var out2 strings.Builder
	cmd2.Stdout, cmd2.Stderr = &out2, &out2
	if err := d.Launch("fs", cmd2, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	// The fixed location: an override on a grant naming it opens nothing.
	fileGrant(t, d, backend.FileEntry{Path: r + "/secret", Access: backend.FileRead, Override: true})
	wantSh(t, d, "a fixed location (the agent's own) with an override", "cat "+r+"/secret/f", false)
	snap, err := d.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if m := (backend.Delta{Files: []backend.FileEntry{on}}).Missing(snap.Deltas["fs"]); m != "" {
		t.Errorf("snapshot lacks the override: %s", m)
	}
	off := on
	off.Override = false
	if err := d.SetFileOverride("fs", off); err != nil {
		t.Fatal(err)
	}
	wantSh(t, d, "the override taken back", "cat "+key, false)
	io.WriteString(in2, "go\n")
	in2.Close()
	if err := cmd2.Wait(); err == nil {
		t.Errorf("a process launched while the override was in force read the credential after it went: %q", out2.String())
	} else {
		t.Logf("verified: a process launched during the override, after it: denied (%v, %s)", err, strings.TrimSpace(out2.String()))
	}
	// Bad input changes nothing: an entry the session does not hold.
	if err := d.SetFileOverride("fs", backend.FileEntry{Path: r + "/other", Access: backend.FileRead, Handle: named, Override: true}); err == nil {
		t.Error("an override of an entry not held: accepted")
	}
	wantSh(t, d, "after the refused override", "cat "+r+"/home/u/.ssh/id_ed25519", false)
}
