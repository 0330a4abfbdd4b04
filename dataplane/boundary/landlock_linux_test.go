package boundary

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"golang.org/x/sys/unix"
)

// TestLandlockCredentials (issue 19, build item 3): the Landlock baseline
// denies a credential location to a session process although the mount
// view shows it (the host root, read-only, with no mask there) and file
// permissions would let the session's uid read it; its siblings stay
// readable; a workspace stays writable (the mount view decides there).
// The ways around it a session process has: a symbolic link in its
// workspace, "..", /proc/self/root, a hard link into its workspace, a
// rename out of the location; none gives access. Run through the C
// launcher here and through the Go launcher by TestGoLaunchMode.
func TestLandlockCredentials(t *testing.T) {
	setup(t)
	dir, err := os.MkdirTemp(helperDir, "ll-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	cred, open := filepath.Join(dir, "state"), filepath.Join(dir, "open")
	for _, d := range []string{cred, open} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// World-readable: only Landlock stands between the session and them.
	os.WriteFile(filepath.Join(cred, "secret"), []byte("CRED-SECRET\n"), 0o644)
	os.WriteFile(filepath.Join(open, "ok"), []byte("OPEN-OK\n"), 0o644)
	if out, err := exec.Command("cp", "/bin/true", filepath.Join(cred, "tool")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	b := newBoundary(t, Config{FileNever: []string{cred, "/etc/shadow", "/etc/gshadow"}}, nil)
	if i := slices.IndexFunc(b.Report(), func(s backend.Strength) bool { return s.Class == MechLandlockFS }); !b.useLandlockFS || i < 0 || b.Report()[i].Level != backend.FixedAtExec {
		t.Fatalf("the Landlock baseline is not in use, or not reported fixed at exec: %+v", b.Report())
	}
	session(t, b, "ll", 70)
	ws := workspaceDir(t)
	if err := b.SetWorkspace("ll", backend.Workspace{Dir: ws, Mode: backend.ModeWorkspaceWrite}); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(ws, cred)
	for _, c := range []struct {
		what, script string
		ok           bool
		want         string
	}{
		{"sibling of the location", "cat " + open + "/ok", true, "OPEN-OK"},
		{"/etc/passwd beside the denied shadow files", "head -c 5 /etc/passwd", true, "root:"},
		{"workspace write", "echo w > " + ws + "/f && cat " + ws + "/f", true, "w"},
		{"git in the workspace", "cd " + ws + " && git init -q r && cd r && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m x && git log --oneline | wc -l", true, "1"},
		{"read the location's file", "cat " + cred + "/secret", false, "Permission denied"},
		{"list the location", "ls " + cred, false, "Permission denied"},
		{"/etc/shadow", "cat /etc/shadow", false, "Permission denied"},
		{"symlink in the workspace", "ln -s " + cred + "/secret " + ws + "/l && cat " + ws + "/l", false, "Permission denied"},
		{"..", "cat " + ws + "/" + rel + "/secret", false, "Permission denied"},
		{"/proc/self/root", "cat /proc/self/root" + cred + "/secret", false, "Permission denied"},
		{"hard link into the workspace", "ln " + cred + "/secret " + ws + "/h && cat " + ws + "/h", false, ""},
		{"rename out of the location", "mv " + cred + "/secret " + ws + "/m && cat " + ws + "/m", false, ""},
		{"execute from the location", cred + "/tool", false, "Permission denied"},
		{"execute a copy elsewhere", "cp /bin/true " + ws + "/t && " + ws + "/t && echo ran", true, "ran"},
	} {
		if strings.Contains(c.script, "git ") {
			if !kerneltest.HaveProgram(t, "git") {
				t.Logf("not checked here (no git): %s", c.what)
				continue
			}
		}
		out, ok := inSession(t, b, "ll", "/", c.script)
		if ok != c.ok || !strings.Contains(out, c.want) || strings.Contains(out, "CRED-SECRET") {
			t.Errorf("%s: exit ok %v (want %v), output %q (want it to hold %q, never the secret)", c.what, ok, c.ok, out, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(cred, "secret")); err != nil {
		t.Errorf("the credential file was moved or removed: %v", err)
	}
}

// TestLandlockRules: the hierarchy's rules leave out each credential
// location and every directory holding one, cover their siblings, skip
// symbolic links, and ignore locations that do not exist or lie under the
// session's own mounts (/tmp: its own tmpfs).
func TestLandlockRules(t *testing.T) {
	dir, err := os.MkdirTemp("/var/tmp", "shinken-llrules-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"a/cred", "a/b", "c"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	os.Symlink(filepath.Join(dir, "a/cred"), filepath.Join(dir, "a/link"))
	never := []string{filepath.Join(dir, "a/cred"), "/nonexistent/x", "/tmp/shinken-agent-state"}
	seen := map[string]bool{}
	rules := landlockRules(never, true, func(d string, _ *unix.Stat_t) { seen[d] = true })
	for _, r := range []string{filepath.Join(dir, "a/b"), filepath.Join(dir, "c"), "/tmp", "/etc", "/usr"} {
		if !slices.Contains(rules, r) {
			t.Errorf("no rule for %s", r)
		}
	}
	for _, r := range []string{"/", "/var", "/var/tmp", dir, filepath.Join(dir, "a"), filepath.Join(dir, "a/cred"), filepath.Join(dir, "a/link")} {
		if slices.Contains(rules, r) {
			t.Errorf("a rule for %s (a credential location, a directory holding one or a symbolic link)", r)
		}
	}
	if !seen[filepath.Join(dir, "a")] || seen["/tmp"] || seen["/nonexistent"] {
		t.Errorf("descended: %v", seen)
	}
	if got := landlockRules([]string{"/nonexistent/x"}, true, func(string, *unix.Stat_t) {}); !slices.Equal(got, []string{"/"}) {
		t.Errorf("no credential location exists: rules %v, want /", got)
	}
	// A credential location in the host's /run (a runtime socket, the
	// agent's socket directory) is not in the session's view, which has a
	// /run of its own: /run gets one rule, and is not descended.
	runCred, err := os.MkdirTemp("/run", "shinken-llrules-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runCred) })
	seen = map[string]bool{}
	rules = landlockRules(append(slices.Clone(never), runCred), true, func(d string, _ *unix.Stat_t) { seen[d] = true })
	if !slices.Contains(rules, "/run") || seen["/run"] || slices.Contains(rules, runCred) {
		t.Errorf("a credential location in the host's /run: rule for /run %v, /run descended %v", slices.Contains(rules, "/run"), seen["/run"])
	}
	var tree landlockTree
	first, gen1 := tree.get(never, true)
	os.Mkdir(filepath.Join(dir, "a/new"), 0o755)
	if again, gen2 := tree.get(never, true); slices.Equal(first, again) || !slices.Contains(again, filepath.Join(dir, "a/new")) || gen2 == gen1 {
		t.Errorf("the rules were not rebuilt after a descended directory changed (build %d, then %d)", gen1, gen2)
	}
	// Racily clean: a directory stamped less than racyWindow before the
	// walk can change again within the same stamp (a kernel's coarse
	// timestamps: Linux 6.1 in the VM), so such rules are rebuilt.
	var racy landlockTree
	racy.get(never, true)
	if racy.fresh() {
		t.Errorf("rules built within %v of a descended directory's change were trusted", racyWindow)
	}
	racy.built = racy.built.Add(2 * racyWindow) // as if the walk were later
	if !racy.fresh() {
		t.Errorf("rules built well after every change were not trusted")
	}
}
