package boundary

import (
	"archive/zip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// The real work a session exists for, done through the launcher in a fresh
// session with a workspace (issue 19): a git clone of a local repository,
// make (gcc) of a small program and pip install --target of a local wheel
// succeed in workspace-write and fail in read-only.

const hello = `#include <stdio.h>
int main(void) { puts("hello from the workspace"); return 0; }
`

const makefile = "hello: hello.c\n\tgcc -o hello hello.c\n"

// workSources makes, under helperDir (visible read-only inside sessions),
// a git repository holding hello.c and a Makefile, and a wheel of a
// one-module package; it returns their paths.
func workSources(t *testing.T) (repo, wheel string) {
	t.Helper()
	dir, err := os.MkdirTemp(helperDir, "src-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	repo = filepath.Join(dir, "repo")
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, c := range map[string]string{"hello.c": hello, "Makefile": makefile} {
		if err := os.WriteFile(filepath.Join(repo, f), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-q", "-m", "hello")
	wheel = filepath.Join(dir, "shkdemo-1.0-py3-none-any.whl")
	f, err := os.Create(wheel)
	if err != nil {
		t.Fatal(err)
	}
	z := zip.NewWriter(f)
	files := map[string]string{
		"shkdemo.py":                          "GREETING = 'hello'\n",
		"shkdemo-1.0.dist-info/METADATA":      "Metadata-Version: 2.1\nName: shkdemo\nVersion: 1.0\n",
		"shkdemo-1.0.dist-info/WHEEL":         "Wheel-Version: 1.0\nGenerator: shinken-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"shkdemo-1.0.dist-info/top_level.txt": "shkdemo\n",
	}
	var record strings.Builder
	for name, body := range files {
		w, err := z.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(body))
		fmt.Fprintf(&record, "%s,,\n", name)
	}
	record.WriteString("shkdemo-1.0.dist-info/RECORD,,\n")
	w, _ := z.Create("shkdemo-1.0.dist-info/RECORD")
	w.Write([]byte(record.String()))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Chmod(wheel, 0o644)
	return repo, wheel
}

// inSession runs the shell script in session name and returns its output
// and whether it exited 0.
func inSession(t *testing.T, b *Boundary, name, dir, script string) (string, bool) {
	t.Helper()
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Dir: dir,
		Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp"}}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := b.Launch(name, cmd, LaunchOptions{}, true); err != nil {
		t.Fatalf("launch in %s: %v", name, err)
	}
	err := cmd.Wait()
	return out.String(), err == nil
}

func workspaceDir(t *testing.T) string {
	t.Helper()
	ws, err := os.MkdirTemp(helperDir, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(ws, 0o755)
	return ws
}

func TestWorkspaceRealWork(t *testing.T) {
	kerneltest.RequirePrograms(t, "git", "make", "gcc", "python3")
	b := newBoundary(t, Config{}, nil)
	repo, wheel := workSources(t)
	for i, mode := range []string{backend.ModeWorkspaceWrite, backend.ModeReadOnly} {
		t.Run(mode, func(t *testing.T) {
			ws := workspaceDir(t)
			name := fmt.Sprintf("work-%d", i)
			session(t, b, name, uint32(60+i))
			if err := b.SetWorkspace(name, backend.Workspace{Dir: ws, Mode: mode}); err != nil {
				t.Fatal(err)
			}
			want := mode == backend.ModeWorkspaceWrite
			steps := []struct{ what, script string }{
				{"git clone", "git config --global --add safe.directory '*' && git clone -q " + repo + " " + ws + "/repo"},
				{"make", "mkdir -p " + ws + "/build && cd " + ws + "/build && cp " + repo + "/hello.c " + repo + "/Makefile . && make -s && ./hello"},
				{"pip install --target", "python3 -m pip install -q --no-index --no-cache-dir --disable-pip-version-check --target " + ws + "/site " + wheel +
					" && PYTHONPATH=" + ws + "/site python3 -c 'import shkdemo; print(shkdemo.GREETING)'"},
			}
			for _, s := range steps {
				start := time.Now()
				out, ok := inSession(t, b, name, "/", s.script)
				if ok != want {
					t.Errorf("%s in %s: ok=%v, want %v\n%s", s.what, mode, ok, want, out)
				} else {
					t.Logf("verified: %s in %s: ok=%v in %.1fs (%s)", s.what, mode, ok, time.Since(start).Seconds(), lastLine(out))
				}
			}
			if !want {
				return
			}
			// On disk, what the session made is the workspace owner's
			// (root here): the idmapping, not a chown of the tree.
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(ws, "build", "hello"), &st); err != nil {
				t.Fatal(err)
			} else if st.Uid != 0 || st.Gid != 0 {
				t.Errorf("built file owned by %d:%d on the host, want the workspace owner 0:0", st.Uid, st.Gid)
			}
			// Inside, the workspace's files are the session's.
			uid, _ := b.UID(uint32(60 + i))
			out, _ := inSession(t, b, name, ws, "stat -c %u:%g build/hello")
			if strings.TrimSpace(out) != fmt.Sprintf("%d:%d", uid, uid) {
				t.Errorf("inside, build/hello is owned by %q, want the session's %d", out, uid)
			}
			// nosuid, nodev and the idmapping, as the session sees it.
			if out, _ := inSession(t, b, name, "/", "grep ' "+ws+" ' /proc/self/mountinfo"); !strings.Contains(out, "nosuid") || !strings.Contains(out, "nodev") || !strings.Contains(out, "idmapped") {
				t.Errorf("workspace mount options: %q, want nosuid, nodev, idmapped", out)
			}
			// Outside the workspace the root stays read-only.
			if out, ok := inSession(t, b, name, "/", "touch "+helperDir+"/outside"); ok {
				t.Errorf("write outside the workspace succeeded: %s", out)
			}
			// The host's own mount table has no trace of the view (read
			// by a new process: a thread of this one may have been left
			// in a session's namespace, and /proc/self names the leader).
			if mi, _ := exec.Command("cat", "/proc/self/mountinfo").Output(); strings.Contains(string(mi), ws) {
				t.Errorf("the workspace mount leaked into the host's mount namespace")
			}
		})
	}
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

// TestWorkspaceProtected: .git/hooks and .git/config of a workspace stay
// read-only in workspace-write mode, and neither they nor .git can be
// renamed or removed to put writable copies in their place.
func TestWorkspaceProtected(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	ws := workspaceDir(t)
	hasGit, hasPy := kerneltest.HaveProgram(t, "git"), kerneltest.HaveProgram(t, "python3")
	if !hasGit {
		// A host without git: the paths are what is protected.
		t.Logf("no git here: .git made by hand; not checked: replace .git via git init")
		for _, d := range []string{".git/hooks", ".git/objects", ".git/refs"} {
			if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for f, c := range map[string]string{".git/config": "[core]\n", ".git/HEAD": "ref: refs/heads/main\n", ".git/description": "x\n"} {
			if err := os.WriteFile(filepath.Join(ws, f), []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	} else if out, err := exec.Command("git", "init", "-q", ws).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	if !hasPy {
		t.Logf("no python3 here: not checked: open with a setuid mode, chmod through fchmodat2, openat2")
	}
	session(t, b, "prot", 70)
	w := backend.Workspace{Dir: ws, Mode: backend.ModeWorkspaceWrite, Protected: []string{ws + "/.git/config", ws + "/.git/hooks", ws + "/.shinken/policy.cedar"}}
	if err := b.SetWorkspace("prot", w); err != nil {
		t.Fatal(err)
	}
	attacks := map[string]string{
		"write .git/config":         "echo '[core] hooksPath=/tmp' >> .git/config",
		"new hook":                  "printf '#!/bin/sh\\n' > .git/hooks/post-checkout",
		"remove .git/hooks":         "rm -rf .git/hooks && test ! -e .git/hooks",
		"rename .git":               "mv .git .git-old",
		"rename .git/hooks":         "mv .git/hooks .git/hooks-old",
		"remove .git/config":        "rm -f .git/config && test ! -e .git/config",
		"replace .git via git init": "rm -rf .git && git init -q . && test -w .git/config",
	}
	for what, script := range attacks {
		if !hasGit && strings.Contains(script, "git init") {
			continue
		}
		if out, ok := inSession(t, b, "prot", ws, script); ok {
			t.Errorf("%s succeeded: %s", what, out)
		} else {
			t.Logf("verified: %s fails", what)
		}
	}
	// The workspace is root's: what the session makes there is root's on
	// the host, so no set-user-ID or set-group-ID bit may be set on it.
	for what, script := range map[string]string{
		"chmod u+s":                "cp /bin/true suid && chmod u+s suid",
		"chmod g+s":                "cp /bin/true sgid && chmod g+s sgid",
		"open with a setuid mode":  `python3 -c 'import os; os.open("suid2", os.O_CREAT|os.O_WRONLY, 0o4755)'`,
		"mkdir with a setgid mode": "mkdir -m 2755 sgid-dir",
		"chmod through fchmodat2":  `python3 -c 'import os; open("f2","w").close(); os.chmod("f2", 0o6755)'`,
		"openat2 (mode in memory)": `python3 -c 'import ctypes,sys; sys.exit(0 if ctypes.CDLL(None).syscall(437, -100, b"o2", None, 0) >= 0 else 1)'`,
	} {
		if !hasPy && strings.Contains(script, "python3") {
			continue
		}
		if out, ok := inSession(t, b, "prot", ws, script); ok {
			t.Errorf("%s succeeded in the workspace: %s", what, out)
		} else {
			t.Logf("verified: %s refused", what)
		}
	}
	if out, err := exec.Command("find", ws, "-perm", "/6000").Output(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("set-ID files on the host: %q %v", out, err)
	}
	if out, ok := inSession(t, b, "prot", ws, "echo x > file && mkdir -p d/e && echo y > .git/description"); !ok {
		t.Errorf("plain writes in the workspace (and the rest of .git) failed: %s", out)
	}
	if _, err := os.Stat(filepath.Join(ws, ".git", "hooks")); err != nil {
		t.Errorf(".git/hooks gone on the host: %v", err)
	}
	// A protected path that is a symbolic link is refused.
	os.Symlink("/etc", filepath.Join(ws, "link"))
	w.Protected = []string{ws + "/link"}
	session(t, b, "prot-link", 71)
	if err := b.SetWorkspace("prot-link", w); err == nil {
		t.Errorf("a symlinked protected path was accepted")
	}
}
