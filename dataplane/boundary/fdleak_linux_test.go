package boundary

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// listFDs is a command that lists every descriptor it holds (ls -l
// /proc/self/fd: ls, not this Go binary, whose runtime keeps cgroup files
// of its own open).
func listFDs() *exec.Cmd {
	return &exec.Cmd{Path: "/bin/ls", Args: []string{"ls", "-l", "/proc/self/fd/"}, Dir: "/", Env: []string{"PATH=/usr/bin:/bin"}}
}

// leakyFDs opens, in the test process, what an agent's parent may leave
// it without close-on-exec: a directory descriptor of the host's root (from
// which openat escapes any mount view) and a pipe.
func leakyFDs(t *testing.T) {
	t.Helper()
	// Above what os/exec moves a launch's own descriptors to (F_DUPFD
	// leaves the copy without close-on-exec).
	high := func(fd int, err error) int {
		if err != nil {
			t.Fatal(err)
		}
		n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, 100)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		return n
	}
	root := high(unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0))
	var p [2]int
	err := unix.Pipe2(p[:], unix.O_CLOEXEC)
	p[0] = high(p[0], err)
	p[1] = high(p[1], nil)
	t.Cleanup(func() { unix.Close(root); unix.Close(p[0]); unix.Close(p[1]) })
	for _, fd := range []int{root, p[0], p[1]} {
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC != 0 {
			t.Fatalf("fd %d: flags %d, %v: not inheritable", fd, flags, err)
		}
	}
	t.Logf("inheritable in the test process: fd %d (/), fds %d, %d (a pipe)", root, p[0], p[1])
}

// checkFDs: out (listFDs) lists exactly the descriptors want.
func checkFDs(t *testing.T, how, out string, want ...string) {
	t.Helper()
	var got []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[len(f)-2] != "->" {
			continue
		}
		if t := f[len(f)-1]; strings.HasPrefix(t, "/proc/") && strings.HasSuffix(t, "/fd") {
			continue // ls's own, reading the list
		}
		got = append(got, f[len(f)-3])
	}
	if len(got) == 0 {
		t.Errorf("%s: no descriptor list: %q", how, out)
		return
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: the session process holds descriptors %v, want exactly %v:\n%s", how, got, want, out)
		return
	}
	t.Logf("%s: %s", how, strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
}

// TestNoInheritedDescriptors: a descriptor the agent inherited without
// close-on-exec (here: the test process's own, a directory descriptor of
// the host's root and a pipe) never reaches a session process, through
// the C launcher or the Go launcher's launch mode, through Launch (with
// and without descriptors of its own to pass) or Prepare and StartPrepared
// (the shim's path): the process holds 0, 1, 2 and the ExtraFiles it was
// given, nothing else.
func TestNoInheritedDescriptors(t *testing.T) {
	setup(t)
	leakyFDs(t)
	for i, c := range []struct {
		name string
		cfg  Config
	}{
		{"C launcher", Config{}},
		{"Go launcher", Config{Exec: filepath.Join(helperDir, "no-c-launcher")}},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			b := newBoundary(t, c.cfg, nil)
			if (b.cexe != nil) != (i == 0) {
				if i == 0 {
					t.Skipf("no C launcher here: %s", b.Launcher())
				}
				t.Fatalf("%s: launcher %s", c.name, b.Launcher())
			}
			name := fmt.Sprintf("fds%d", i)
			session(t, b, name, uint32(91+i))

			checkFDs(t, "Launch", runIn(t, b, name, listFDs(), true), "0", "1", "2")

			// One descriptor given on purpose (ExtraFiles): fd 3, and no more.
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd := listFDs()
			cmd.ExtraFiles = []*os.File{r}
			out := runIn(t, b, name, cmd, false)
			r.Close()
			w.Close()
			checkFDs(t, "Launch with ExtraFiles", out, "0", "1", "2", "3")

			// Privileged (no Landlock ruleset among the launcher's descriptors).
			var pout strings.Builder
			cmd = listFDs()
			cmd.Stdout, cmd.Stderr = &pout, &pout
			if err := b.Launch(name, cmd, LaunchOptions{Privileged: true}, true); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("privileged launch: %v %q", err, pout.String())
			}
			checkFDs(t, "Launch privileged", pout.String(), "0", "1", "2")

			pl, err := b.Prepare(name, backend.LaunchSpec{Argv: listFDs().Args, Env: listFDs().Env}, LaunchOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			null, _ := os.Open(os.DevNull)
			st, err := StartPrepared(backend.StartRequest{Args: pl.Args, Files: pl.Files, Stdin: null, Stdout: pw, Stderr: pw})
			pw.Close()
			null.Close()
			pl.Close(err != nil)
			if err != nil {
				t.Fatal(err)
			}
			b2, _ := io.ReadAll(pr)
			pr.Close()
			if ps, _ := st.Process.Wait(); !ps.Success() {
				t.Fatalf("prepared launch: %v %q", ps, b2)
			}
			checkFDs(t, "Prepare+StartPrepared", string(b2), "0", "1", "2")
			// The layouts with the session's Landlock ruleset among the
			// launcher's descriptors were those above (but the privileged).
			built := b.rulesets.builds.Load() + b.rulesets.prebuilds.Load()
			if b.useLandlockFS && built == 0 {
				t.Errorf("no launch entered a session ruleset")
			}
			t.Logf("Landlock baseline: %v, rulesets built (at launch or create): %d", b.useLandlockFS, built)
		})
	}
}
