package dataplane

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// memfdExecEnv names the mode in which the test binary copies the static
// program the variable names into a memfd and executes it twice over
// (execveat of the descriptor, then execve of /proc/self/fd/N), printing
// each refusal; a program that runs replaces it.
const memfdExecEnv = "SHINKEN_TEST_MEMFD_EXEC"

func memfdExecMain() {
	b, err := os.ReadFile(os.Getenv(memfdExecEnv))
	if err != nil {
		fmt.Println("read:", err)
		os.Exit(2)
	}
	fd, err := unix.MemfdCreate("x", 0)
	if err == nil {
		_, err = unix.Write(fd, b)
	}
	if err != nil {
		fmt.Println("memfd:", err)
		os.Exit(2)
	}
	argv, env := []string{"c", "-V"}, []string{}
	fmt.Println("execveat:", execveat(fd, argv))
	err = unix.Exec(fmt.Sprintf("/proc/self/fd/%d", fd), argv, env)
	fmt.Println("/proc/self/fd:", err)
	os.Exit(0)
}

// execveat executes the file of fd (AT_EMPTY_PATH) with no environment.
func execveat(fd int, argv []string) error {
	var args []*byte
	for _, a := range argv {
		p, err := unix.BytePtrFromString(a)
		if err != nil {
			return err
		}
		args = append(args, p)
	}
	args = append(args, nil)
	env := []*byte{nil}
	empty := []byte{0}
	_, _, e := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(&empty[0])), uintptr(unsafe.Pointer(&args[0])), uintptr(unsafe.Pointer(&env[0])), unix.AT_EMPTY_PATH, 0)
	return e
}

// execLSM skips unless the exec allowlist is the BPF LSM's here.
func execLSM(t *testing.T, d *Dataplane) {
	t.Helper()
	if !d.execLSMOn() {
		t.Skipf("the exec allowlist is not BPF LSM here (%v): .ci/vmtest runs this test on a kernel with BPF LSM", d.xlsm.err)
	}
	row := d.Probe().Class(backend.ClassProcess)
	if row.Level != backend.RevocableAtNextUse || !strings.Contains(row.Mechanism, "bprm_check_security") {
		t.Fatalf("process row: %s: %s", row.Level, row.Mechanism)
	}
}

// TestProcessExecLSM: where BPF LSM is attached, what the LSM path adds to
// TestProcessExecGate: a memfd's program is refused without memfd_noexec
// (Linux 6.1 has none); ld.so run directly is refused while a listed
// dynamic program runs; a revoke is the one handle write (the next exec
// fails before any exec entry changes) and is counted; the gate holds
// while no agent runs and a restarted agent writes no difference.
func TestProcessExecLSM(t *testing.T) {
	d, cfg := procSessions(t, "l1", "l2")
	execLSM(t, d)
	helper := testBinaryInView(t)
	procGrant(t, d, "l1", HandleRef{}, 0, "/bin/sh", "/usr/bin/true", helper)
	s1, _ := d.Session("l1")

	memfd := func(session string) string {
		t.Helper()
		cmd := exec.Command(helper)
		cmd.Env = []string{memfdExecEnv + "=" + boundary.DefaultCatatonit}
		cmd.Dir = "/"
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := d.Launch(session, cmd, ProcOptions{}); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		return out.String()
	}
	if out := memfd("l1"); strings.Count(out, "permission denied") != 2 {
		t.Errorf("a memfd's program in the gated session: %q, want both execs refused", out)
	} else {
		t.Logf("verified: memfd fexecve and /proc/self/fd exec refused: %q", out)
	}
	if out := memfd("l2"); strings.Contains(out, "permission denied") || !strings.Contains(out, "catatonit") {
		t.Errorf("a memfd's program in the session not gated: %q, want it run", out)
	}
	wantRun(t, d, "l1", "/lib64/ld-linux-x86-64.so.2 /usr/bin/true", false)
	wantRun(t, d, "l1", "/usr/bin/true", true) // dynamic: its ld.so loads without an exec check

	// A revoke is the one handle write: the next exec fails before the
	// sweep changes any exec entry.
	h2 := procGrant(t, d, "l1", HandleRef{}, 0, "/usr/bin/id")
	sh := startShell(t, d, "l1")
	if !sh.run("/usr/bin/id -u") {
		t.Fatal("id did not run after its grant")
	}
	entries := d.ExecLSMEntries("l1")
	before, writes := d.Ops(), d.ops.execWrites.Load()
	denied, _ := d.Counters(s1.Index)
	err := d.RevokeThen(h2, func() {
		if w := d.ops.execWrites.Load() - writes; w != 0 {
			t.Errorf("%d exec entry writes before the revoke's handle write returned", w)
		}
		if sh.run("/usr/bin/id -u") {
			t.Error("id ran after its handle was revoked (before the sweep)")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if w := d.Ops().RevokeWrites - before.RevokeWrites; w != 1 {
		t.Errorf("revoke: %d handle writes, want 1", w)
	}
	if n := d.ExecLSMEntries("l1"); n != entries-1 || d.ops.execWrites.Load()-writes != 1 {
		t.Errorf("after the sweep: %d entries (was %d), %d writes; want the revoked one deleted, one write", n, entries, d.ops.execWrites.Load()-writes)
	}
	if c, err := d.Counters(s1.Index); err != nil || c[backend.ReasonExecDenied] != denied[backend.ReasonExecDenied]+1 {
		t.Errorf("exec_denied %d -> %d over one refused exec (%v)", denied[backend.ReasonExecDenied], c[backend.ReasonExecDenied], err)
	}
	t.Logf("verified: revoke is one handle write; the refused exec counted; the sweep then deleted one entry")

	// No agent: the pinned link and maps keep the gate.
	d.Close()
	if sh.run("/usr/bin/id -u") {
		t.Error("id ran while no agent ran")
	}
	if !sh.run("/usr/bin/true") {
		t.Error("true did not run while no agent ran")
	}
	d2 := newDataplane(t, cfg)
	if e := d2.Probe().Facts["session_boundary_adopt_errors"]; e != "" {
		t.Fatalf("adoption: %s", e)
	}
	if n, w := d2.ExecLSMEntries("l1"), d2.ops.execWrites.Load(); n != entries-1 || w != 0 {
		t.Errorf("restarted agent: %d entries (want %d), %d writes (want none: nothing differed)", n, entries-1, w)
	}
	if sh.run("/usr/bin/id -u") || !sh.run("/usr/bin/true") {
		t.Error("the gate changed with the agent's restart")
	}
	wantRun(t, d2, "l2", "/usr/bin/id", true)
}

// TestProcessExecLSMUserNS: the LSM's check is by the session's cgroup, not
// by its mounts: with user namespaces allowed in sessions the class is
// available, and a program executed inside a user namespace the session
// makes is still checked.
func TestProcessExecLSMUserNS(t *testing.T) {
	d, _ := procSessionsWith(t, func(c *boundary.Config) { c.AllowUserNS = true }, "u1")
	execLSM(t, d)
	procGrant(t, d, "u1", HandleRef{}, 0, "/bin/sh", "/usr/bin/true", "/usr/bin/unshare")
	if ok, out := shIn(t, d, "u1", "unshare -U /usr/bin/true"); !ok {
		t.Skipf("a user namespace cannot be made in a session here: %s", out)
	}
	wantRun(t, d, "u1", "unshare -Ur /usr/bin/id", false)
	wantRun(t, d, "u1", "unshare -U /usr/bin/id", false)
	t.Log("verified: an exec inside a user namespace of the session is checked")
}
