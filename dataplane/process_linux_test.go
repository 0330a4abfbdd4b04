package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// procSessions opens a dataplane with the boundary and makes the sessions
// named; it skips where the process class is unavailable.
func procSessions(t *testing.T, names ...string) (*Dataplane, Config) {
	t.Helper()
	return procSessionsWith(t, nil, names...)
}

// procSessionsWith is procSessions with the boundary's config changed by
// set (when not nil: a config only the exec LSM gates, so it skips where
// the exec LSM is not attached).
func procSessionsWith(t *testing.T, set func(*boundary.Config), names ...string) (*Dataplane, Config) {
	t.Helper()
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here (the boundary is tested on the host): %v", boundary.DefaultCatatonit, err)
	}
	cfg := testConfig(t)
	// The exec gate needs a static launcher: the C one, built here.
	launcher := cLauncher(t)
	cfg.Boundary = &boundary.Config{Exec: launcher}
	if set != nil {
		set(cfg.Boundary)
	}
	d := newDataplane(t, cfg)
	if set != nil && !d.execLSMOn() {
		t.Skipf("the exec allowlist is not BPF LSM here (%v): .ci/vmtest runs this test on a kernel with BPF LSM", d.xlsm.err)
	}
	if row := d.Probe().Class(backend.ClassProcess); !row.Level.Enforceable() {
		// The probe's reason (in the VM of .ci/vmtest, Linux 6.1: no
		// vm.memfd_noexec, so no exec gate): a skip there, a failure
		// under CI on the host.
		if os.Getenv("CI") != "" {
			t.Fatalf("process class unavailable on the test host: %s", row.Reason)
		}
		t.Skipf("process class unavailable here: %s", row.Reason)
	}
	for _, n := range names {
		if _, err := d.CreateSession(n, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	return d, cfg
}

// cLauncher is the C launcher: built beforehand where kerneltest.BinDirEnv
// says (the VM of .ci/vmtest has no compiler), else built here.
func cLauncher(t testing.TB) string {
	t.Helper()
	if pre := kerneltest.Prebuilt(t, boundary.ExecName); pre != "" {
		return pre
	}
	launcher := filepath.Join(t.TempDir(), boundary.ExecName)
	if out, err := exec.Command("../cmd/shinken-exec/build", launcher).CombinedOutput(); err != nil {
		t.Fatalf("build the C launcher: %v: %s", err, out)
	}
	return launcher
}

// procTree makes, under /var/tmp (visible read-only in sessions), the files
// true-file and id-file (hard links to /usr/bin/true and to its neighbour
// /usr/bin/id where /var/tmp is on /usr's file system, as on this host;
// copies where it is not, as in the VM of .ci/vmtest), true-link and
// id-link (hard links to those), and scripts: one run by /bin/sh, one
// whose interpreter is /usr/bin/id. A grant of true-file covers true-link.
func procTree(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "shinken-proc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	for name, target := range map[string]string{"true": "/usr/bin/true", "id": "/usr/bin/id"} {
		file := filepath.Join(dir, name+"-file")
		if err := os.Link(target, file); errors.Is(err, unix.EXDEV) {
			t.Logf("%s is a copy of %s (/var/tmp and /usr are different file systems here)", file, target)
			copyFile(t, target, file)
		} else if err != nil {
			t.Fatal(err)
		}
		if err := os.Link(file, filepath.Join(dir, name+"-link")); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"ok.sh": "#!/bin/sh\necho script-ran\n", "bad.sh": "#!/usr/bin/id\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// python3 is the session's python where the host has one (the VM of
// .ci/vmtest has it on its tools' disk; kerneltest.HaveProgram).
func python3(t *testing.T) (string, bool) {
	if !kerneltest.HaveProgram(t, "python3") {
		t.Log("no /usr/bin/python3 here: the cases that need it are left out")
		return "", false
	}
	return "/usr/bin/python3", true
}

func procGrant(t *testing.T, d *Dataplane, session string, parent HandleRef, max uint32, progs ...string) HandleRef {
	t.Helper()
	h := mustHandle(t, d, parent, time.Time{})
	var es []backend.ProcessEntry
	for _, p := range progs {
		es = append(es, backend.ProcessEntry{Exec: p, Handle: h})
	}
	if max != 0 {
		es = append(es, backend.ProcessEntry{MaxProcesses: max, Handle: h})
	}
	if err := d.Apply(session, backend.Delta{Process: es}); err != nil {
		t.Fatal(err)
	}
	return h
}

func wantRun(t *testing.T, d *Dataplane, session, script string, want bool) string {
	t.Helper()
	ok, out := shIn(t, d, session, script)
	if ok != want {
		t.Errorf("%s in %s: ran %v, want %v (%s)", script, session, ok, want, out)
	}
	return out
}

// TestProcessExecGate: in a session given a process grant, a program on
// the list runs and one off it does not, whatever path reaches it; another
// session is untouched; a grant and a revoke reach a shell already
// running at its next exec; the gate comes back with a restarted agent.
func TestProcessExecGate(t *testing.T) {
	d, cfg := procSessions(t, "p1", "p2")
	dir := procTree(t)
	wantRun(t, d, "p1", "/usr/bin/id", true) // not gated yet
	if err := d.Apply("p1", backend.Delta{Process: []backend.ProcessEntry{{Exec: "/usr/bin/nonexistent", Handle: mustHandle(t, d, HandleRef{}, time.Time{})}}}); err == nil {
		t.Fatal("a grant of a program the view lacks was applied")
	}
	// /bin/sh is a symlink to dash, /usr/bin/python3 to python3.11: the
	// grant names the file.
	progs := []string{"/bin/sh", "/usr/bin/true", "/usr/bin/cp", "/usr/bin/ln", dir + "/true-file", dir + "/ok.sh", dir + "/bad.sh"}
	py, hasPy := python3(t)
	if hasPy {
		progs = append(progs, py)
	}
	h1 := procGrant(t, d, "p1", HandleRef{}, 0, progs...)
	sh := startShell(t, d, "p1")
	wantRun(t, d, "p1", "/usr/bin/true", true)
	wantRun(t, d, "p1", "exec /bin/dash -c true", true) // the file /bin/sh names
	if out := wantRun(t, d, "p1", "/usr/bin/id", false); !strings.Contains(out, "denied") && !strings.Contains(out, "not permitted") {
		t.Errorf("off the list: %q, want a permission error", out)
	}
	wantRun(t, d, "p2", "/usr/bin/id", true) // another session
	offList := map[string]string{
		"a symlink to a forbidden binary":        "ln -s /usr/bin/id /tmp/x && /tmp/x",
		"a hard link to an allowed neighbour":    dir + "/id-link",
		"a copy of a forbidden binary into /tmp": "cp /usr/bin/id /tmp/id && /tmp/id",
		"a copy of an allowed binary into /tmp":  "cp /usr/bin/true /tmp/t && /tmp/t",
		"ld.so running a forbidden binary":       "/lib64/ld-linux-x86-64.so.2 /usr/bin/id",
		"ld.so running an allowed binary":        "/lib64/ld-linux-x86-64.so.2 /usr/bin/true",
		"a script whose interpreter is off":      dir + "/bad.sh",
		"a static program off the list":          boundary.DefaultCatatonit + " -V",
	}
	if hasPy {
		// A static program in a memfd: no ELF interpreter for the
		// marks to see (vm.memfd_noexec=2 stops these; the LSM sees the
		// memfd's inode, never listed). TestProcessExecLSM does the same
		// without python.
		offList["memfd_create and fexecve"] = py + ` -c 'import os; f=os.memfd_create("x"); os.write(f, open("` + boundary.DefaultCatatonit + `","rb").read()); os.fchmod(f, 0o755); os.execve(f, ["c", "-V"], {})'`
		offList["execve of /proc/self/fd of a memfd"] = py + ` -c 'import os; f=os.memfd_create("x", os.MFD_EXEC if hasattr(os, "MFD_EXEC") else 0x10); os.write(f, open("` + boundary.DefaultCatatonit + `","rb").read()); os.fchmod(f, 0o755); os.execv("/proc/self/fd/%d" % f, ["c", "-V"])'`
	}
	for what, script := range offList {
		if ok, out := shIn(t, d, "p1", script); ok {
			t.Errorf("%s ran: %s", what, out)
		}
	}
	wantRun(t, d, "p1", "ln -s /usr/bin/true /tmp/t2 && /tmp/t2", true) // a symlink to an allowed one
	wantRun(t, d, "p1", dir+"/true-link", true)                         // the same file as an allowed one
	if out := wantRun(t, d, "p1", dir+"/ok.sh", true); out != "script-ran" {
		t.Errorf("allowed script: %q", out)
	}
	if hasPy {
		wantRun(t, d, "p1", py+` -c 'print(1)'`, true)
	}

	// A mount a later view change attaches (an fs.scope write root) is
	// marked before the grant returns: a forbidden binary copied there
	// does not run, an allowed one's copy neither (another file).
	if err := os.Mkdir(dir+"/w", 0o755); err != nil {
		t.Fatal(err)
	}
	fh := mustHandle(t, d, HandleRef{}, time.Time{})
	if err := d.Apply("p1", backend.Delta{Files: []backend.FileEntry{{Path: dir + "/w", Access: backend.FileWrite, Handle: fh}}}); err != nil {
		t.Fatal(err)
	}
	wantRun(t, d, "p1", "cp /usr/bin/id "+dir+"/w/id", true)
	wantRun(t, d, "p1", dir+"/w/id", false)
	// A static program (no ELF interpreter, whose open the marks of the
	// root would see): only the new mount's own mark stops it.
	wantRun(t, d, "p1", "cp "+boundary.DefaultCatatonit+" "+dir+"/w/static", true)
	wantRun(t, d, "p1", dir+"/w/static -V", false)
	wantRun(t, d, "p2", boundary.DefaultCatatonit+" -V", true)
	if ok, _ := shIn(t, d, "p2", "/usr/bin/id"); !ok {
		t.Error("the other session cannot run id")
	}

	// A shell already running: a grant and a revoke reach its next exec.
	if sh.run("/usr/bin/id -u") {
		t.Error("id ran before its grant")
	}
	h2 := procGrant(t, d, "p1", HandleRef{}, 0, "/usr/bin/id")
	if !sh.run("/usr/bin/id -u") {
		t.Error("id did not run in the running shell after its grant")
	}
	if err := d.Revoke(h2); err != nil {
		t.Fatal(err)
	}
	if sh.run("/usr/bin/id -u") {
		t.Error("id ran in the running shell after its revoke")
	}
	if !sh.run("/usr/bin/true") {
		t.Error("true (still granted) did not run")
	}

	// A restarted agent arms the gate again before it serves.
	d.Close()
	d2 := newDataplane(t, cfg)
	if e := d2.Probe().Facts["session_boundary_adopt_errors"]; e != "" {
		t.Fatalf("adoption: %s", e)
	}
	if sh.run("/usr/bin/id -u") {
		t.Error("id ran in the running shell after the agent restarted")
	}
	if !sh.run("/usr/bin/true") {
		t.Error("true did not run after the agent restarted")
	}
	wantRun(t, d2, "p1", "/usr/bin/id", false)
	wantRun(t, d2, "p2", "/usr/bin/id", true)

	// The last grant's revoke: nothing more runs, no launch either.
	if err := d2.Revoke(h1); err != nil {
		t.Fatal(err)
	}
	if sh.run("/usr/bin/true") {
		t.Error("true ran after every process grant was revoked")
	}
	cmd := exec.Command("/bin/sh", "-c", "true")
	if err := d2.Launch("p1", cmd, ProcOptions{}); err == nil {
		cmd.Wait()
		t.Error("a launch in a session with no live process grant started")
	}
	if d2.execLSMOn() {
		s1, _ := d2.Session("p1")
		c, err := d2.Counters(s1.Index)
		if err != nil || c[backend.ReasonExecDenied] == 0 {
			t.Errorf("p1: exec_denied=%d after refused execs (%v)", c[backend.ReasonExecDenied], err)
		}
		t.Logf("BPF LSM exec gate: p1 exec_denied=%d", c[backend.ReasonExecDenied])
	} else {
		t.Logf("exec gate answers: %d allowed, %d denied", d2.bnd.ExecAnswers(), d2.bnd.ExecDenials())
	}
}

// shell is a /bin/sh running in a session, reading commands from a pipe.
type shell struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
}

func startShell(t *testing.T, d *Dataplane, session string) *shell {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `while read -r line; do eval "$line" >/dev/null 2>&1; echo "RC $?"; done`)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Dir = "/"
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := d.Launch(session, cmd, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		_ = cmd.Process.Kill()
		if err := cmd.Wait(); err != nil || errb.Len() > 0 {
			t.Logf("shell ended: %v %s: %s", err, cmd.ProcessState, errb.String())
		}
	})
	return &shell{t: t, in: in, out: bufio.NewReader(out)}
}

// run runs one command line and says whether it exited 0 (a shell that
// ended, as dash does when it cannot fork, ran nothing).
func (s *shell) run(line string) bool {
	s.t.Helper()
	fmt.Fprintf(s.in, "%s\n", line)
	l, err := s.out.ReadString('\n')
	if err == io.EOF {
		s.t.Logf("the shell ended at %q", line)
		return false
	}
	if err != nil {
		s.t.Fatalf("shell: %v", err)
	}
	return strings.TrimSpace(l) == "RC 0"
}

// TestProcessMaxProcesses: a session granted max_processes cannot fork past
// it (RLIMIT_NPROC of its uid, set on its running processes and its
// launches) while another session still starts processes. The fork loop
// is this test binary's (forkLoopEnv), copied where sessions see it and
// granted.
func TestProcessMaxProcesses(t *testing.T) {
	d, _ := procSessions(t, "m1", "m2")
	loop := testBinaryInView(t)
	procGrant(t, d, "m1", HandleRef{}, 30, "/bin/sh", loop)
	run := func(session string) (int, string) {
		t.Helper()
		cmd := exec.Command(loop)
		cmd.Env = []string{forkLoopEnv + "=1"}
		cmd.Dir = "/"
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := d.Launch(session, cmd, ProcOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("fork loop in %s: %v: %s", session, err, out.String())
		}
		var n int
		f := strings.Fields(lastLine(out.String()))
		if len(f) < 2 {
			t.Fatalf("fork loop in %s: %q", session, out.String())
		}
		if _, err := fmt.Sscan(f[0], &n); err != nil {
			t.Fatalf("fork loop in %s: %q", session, out.String())
		}
		return n, strings.Join(f[1:], " ")
	}
	n, why := run("m1")
	if n >= 30 || n == 0 || !strings.Contains(why, "resource temporarily unavailable") {
		t.Errorf("m1 started %d of 100 forks under max_processes=30 (first error %s), want fewer than 30, some, and EAGAIN", n, why)
	}
	if m, why := run("m2"); m != 100 {
		t.Errorf("m2 (no bound of its own) started %d of 100 (%s)", m, why)
	}
	if b, gated := d.bnd.ProcessBound("m1"); !gated || b != 30 {
		t.Errorf("m1's bound %d (gated %v), want 30", b, gated)
	}
	t.Logf("m1 started %d of 100 forks under max_processes=30 (the loop's own threads count), then %s; %s", n, why, d.pidsMaxFact())
}

// testBinaryInView copies this test binary under /var/tmp (sessions see
// it; their /tmp is their own) and returns its path.
func testBinaryInView(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/var/tmp", "shinken-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	p := filepath.Join(dir, "helper")
	copyFile(t, self, p)
	return p
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(l[len(l)-1])
}

// BenchmarkExecGate: one exec of /usr/bin/true from a shell loop in a
// session, gated (the program and the shell granted) and not gated, side
// by side (each op is one exec; the launch of the loop is amortised over
// b.N).
func BenchmarkExecGate(b *testing.B) {
	for _, gated := range []bool{false, true} {
		b.Run(fmt.Sprintf("gated=%v", gated), func(b *testing.B) {
			kerneltest.RequireRoot(b)
			cfg := testConfig(b)
			launcher := cLauncher(b)
			cfg.Boundary = &boundary.Config{Exec: launcher}
			d := newDataplane(b, cfg)
			if _, err := d.CreateSession("bench", Limits{}); err != nil {
				b.Fatal(err)
			}
			if gated {
				h := mustHandle(b, d, HandleRef{}, time.Time{})
				if err := d.Apply("bench", backend.Delta{Process: []backend.ProcessEntry{{Exec: "/bin/sh", Handle: h}, {Exec: "/usr/bin/true", Handle: h}}}); err != nil {
					b.Fatal(err)
				}
			}
			cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do /usr/bin/true || exit 1; i=$((i+1)); done", b.N))
			cmd.Dir = "/"
			b.ResetTimer()
			if err := d.Launch("bench", cmd, ProcOptions{}); err != nil {
				b.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// launchPrograms executes programs as the conformance suite's process
// uses: each launched straight into the session (the launcher's own exec
// is the use the gate answers).
type launchPrograms struct{ d *Dataplane }

func (launchPrograms) Programs(t *testing.T, n int) []string {
	all := []string{"/usr/bin/true", "/usr/bin/id", "/usr/bin/whoami", "/usr/bin/nproc", "/usr/bin/tty"}
	if n > len(all) {
		t.Fatalf("%d programs asked, %d known", n, len(all))
	}
	return all[:n]
}

// Exec: true when the program ran (exit status aside: tty exits 1 with no
// terminal), false when the launch or its exec was refused.
func (u launchPrograms) Exec(session, path string) (bool, error) {
	cmd := exec.Command(path)
	cmd.Dir = "/"
	err := u.d.Launch(session, cmd, ProcOptions{})
	switch {
	case err == nil:
		_ = cmd.Wait()
		return true, nil
	case errors.Is(err, ErrNotSupported), errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return false, nil
	}
	return false, err
}
