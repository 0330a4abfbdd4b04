package procs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/host"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// Tier-3 tests: real processes in real sessions (the Linux backend with the
// session boundary), each held by a real shim (this test binary,
// re-executed), as root.

func TestMain(m *testing.M) {
	host.Main()          // the session launcher re-executes this binary
	ShimMain(host.Start) // and so does every process's shim
	os.Exit(m.Run())
}

// backendDoor is the agent's door less its record: the backend prepares.
type backendDoor struct{ b backend.Backend }

func (d backendDoor) PrepareLaunch(session string, spec backend.LaunchSpec, opts backend.LaunchOptions, _ string, beside func(*backend.PreparedLaunch) error) (*backend.PreparedLaunch, error) {
	pl, err := d.b.(backend.Preparer).PrepareLaunch(session, spec, opts)
	if err == nil && beside != nil {
		if err = beside(pl); err != nil {
			pl.Close(true)
			pl = nil
		}
	}
	return pl, err
}

type rig struct {
	b       backend.Backend
	cfg     Config
	m       *Manager
	session string
}

func newRig(t *testing.T, ring uint64) *rig {
	t.Helper()
	kerneltest.RequireRoot(t)
	parent, pin := kerneltest.Private("shinken-procs-test-")
	cfg := backend.Config{CgroupParent: parent, PinPath: pin}
	b, err := host.Open(cfg)
	if err != nil {
		t.Fatalf("open backend: %v", err)
	}
	r := &rig{b: b, session: "s1"}
	if _, err := b.CreateSession(r.session, backend.Limits{}); err != nil {
		b.Uninstall()
		t.Fatal(err)
	}
	r.cfg = Config{Dir: t.TempDir(), Door: backendDoor{b}, RingBytes: ring}
	if r.m, err = Open(r.cfg, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.m.Remove(r.session)
		r.m.Close()
		if err := b.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return r
}

func (r *rig) start(t *testing.T, req wire.ProcessStart) *Proc {
	t.Helper()
	p, err := r.m.Start(r.session, req, "test")
	if err != nil {
		t.Fatalf("start %v: %v", req.Argv, err)
	}
	return p
}

// readAll follows stream from off until the process ends (or the timeout).
func readAll(t *testing.T, p *Proc, stream int, off uint64, timeout time.Duration) (string, Chunk) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	var first Chunk
	for i := 0; ; i++ {
		c, ok, err := p.Next(ctx, stream, off, 1<<16)
		if err != nil {
			t.Fatalf("read stream %d: %v (so far %q)", stream, err, out.String())
		}
		if i == 0 {
			first = c
		}
		if !ok {
			return out.String(), first
		}
		out.Write(c.Data)
		off = c.Offset + uint64(len(c.Data))
	}
}

// waitFor reads stream from off until it holds want; it returns the offset
// after it.
func waitFor(t *testing.T, p *Proc, off uint64, want string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	for !strings.Contains(out.String(), want) {
		c, ok, err := p.Next(ctx, 0, off, 1<<16)
		if err != nil || !ok {
			t.Fatalf("waiting for %q: got %q (%v)", want, out.String(), err)
		}
		out.Write(c.Data)
		off = c.Offset + uint64(len(c.Data))
	}
	return off
}

func wait(t *testing.T, p *Proc) wire.Process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("%s did not end: %v", p.ID(), err)
	}
	return p.View()
}

// reopen opens a new manager on r's directory (known: r's session alone,
// or nil for none checked), makes it r's, and returns its view of p.
func reopen(t *testing.T, r *rig, p *Proc, known func(string) bool) *Proc {
	t.Helper()
	m, err := Open(r.cfg, known)
	if err != nil {
		t.Fatal(err)
	}
	r.m = m
	q, err := m.Get(r.session, p.ID())
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestOutputBeforeExit: what a process prints reaches a reader while it
// still runs (it then sleeps), not when it exits.
func TestOutputBeforeExit(t *testing.T) {
	r := newRig(t, 0)
	t0 := time.Now()
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "echo first; sleep 3; echo second"}})
	waitFor(t, p, 0, "first")
	got := time.Since(t0)
	if p.Done() || got > 2*time.Second {
		t.Fatalf("first line after %v (done %v): not streamed", got, p.Done())
	}
	out, _ := readAll(t, p, 0, 0, 10*time.Second)
	end := time.Since(t0)
	if out != "first\nsecond\n" || end < 3*time.Second {
		t.Fatalf("output %q after %v", out, end)
	}
	t.Logf("first line %v after start, exit after %v", got, end)
	if v := p.View(); v.PID <= 1 || v.State != wire.ProcExited || *v.ExitCode != 0 {
		t.Errorf("view: %+v", v)
	}
}

// TestStdinEOF: stdin given at start, then end of file, reaches cat; and
// stdin streamed by an attached client, then closed.
func TestStdinEOF(t *testing.T) {
	r := newRig(t, 0)
	in := "hello\nworld\n"
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/cat"}, Stdin: &in})
	if out, _ := readAll(t, p, 0, 0, 10*time.Second); out != in {
		t.Errorf("cat echoed %q", out)
	}
	if v := wait(t, p); *v.ExitCode != 0 {
		t.Errorf("%+v", v)
	}
	q := r.start(t, wire.ProcessStart{Argv: []string{"/bin/cat"}, Interactive: true})
	if err := q.Stdin([]byte("streamed\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, q, 0, "streamed\n")
	if q.Done() {
		t.Fatal("cat ended before stdin closed")
	}
	if err := q.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	if v := wait(t, q); *v.ExitCode != 0 {
		t.Errorf("%+v", v)
	}
}

// TestPTYSizeAndResize: a terminal's size is what was asked, and a resize
// reaches the process (stty size reads it; SIGWINCH is the kernel's).
func TestPTYSizeAndResize(t *testing.T) {
	r := newRig(t, 0)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "stty size; read x; stty size; tty"}, TTY: &wire.TermSize{Rows: 24, Cols: 80}, Interactive: true})
	off := waitFor(t, p, 0, "24 80")
	if err := p.Resize(wire.TermSize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	p.Stdin([]byte("\n"))
	waitFor(t, p, off, "30 100")
	out, _ := readAll(t, p, 0, 0, 10*time.Second)
	// The terminal is of the session's own devpts instance: /dev/pts/0 is
	// the first of that session, whatever the host has open.
	if !strings.Contains(out, "/dev/pts/0") {
		t.Errorf("tty: %q", out)
	}
}

// TestPTYCtrlC: ^C typed at the terminal interrupts the shell's
// foreground job, and the shell carries on.
func TestPTYCtrlC(t *testing.T) {
	r := newRig(t, 0)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/bash", "--norc", "--noprofile", "-i"}, TTY: &wire.TermSize{Rows: 24, Cols: 80},
		Interactive: true, Env: []string{"PS1=$ ", "PATH=/usr/bin:/bin", "TERM=dumb"}})
	p.Stdin([]byte("sleep 100; echo slept\n"))
	time.Sleep(500 * time.Millisecond)
	p.Stdin([]byte{3})
	p.Stdin([]byte("echo status=$?\n"))
	waitFor(t, p, 0, "status=130")
	p.Stdin([]byte("exit 4\n"))
	if v := wait(t, p); v.ExitCode == nil || *v.ExitCode != 4 {
		t.Errorf("%+v", v)
	}
}

// TestReattachGetsMissingBytes: a reader goes away part way; the process
// keeps running, and a reader from the offset where the first stopped gets
// exactly the bytes it missed.
func TestReattachGetsMissingBytes(t *testing.T) {
	r := newRig(t, 0)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "i=0; while [ $i -lt 30 ]; do echo line-$i; i=$((i+1)); sleep 0.05; done"}})
	off := waitFor(t, p, 0, "line-3\n")
	first, _ := p.Read(0, 0, int(off))
	time.Sleep(300 * time.Millisecond) // "disconnected"
	if p.Done() {
		t.Fatal("ended too early to test")
	}
	rest, c := readAll(t, p, 0, off, 10*time.Second)
	all, _ := readAll(t, p, 0, 0, 10*time.Second)
	if c.Offset != off || c.Dropped != 0 || string(first.Data)+rest != all || !strings.HasSuffix(all, "line-29\n") {
		t.Errorf("first %q + rest %q (from %d: %+v) != %q", first.Data, rest, off, c.Offset, all)
	}
}

// TestRingOverflowReported: a reader asking for bytes the bounded ring
// has dropped is told how many, and gets the rest.
func TestRingOverflowReported(t *testing.T) {
	r := newRig(t, 4096)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "head -c 10000 /dev/zero | tr '\\0' x; echo -n END"}})
	wait(t, p)
	out, c := readAll(t, p, 0, 0, 10*time.Second)
	if c.Dropped != 10003-4096 || len(out) != 4096 || !strings.HasSuffix(out, "xEND") {
		t.Errorf("dropped %d, got %d bytes ending %q", c.Dropped, len(out), out[max(0, len(out)-8):])
	}
}

// TestDeadlineAndSignals: the process's own deadline kills its tree; a
// signal and an exit code pass through; DELETE's kill ends the whole tree.
func TestDeadlineAndSignals(t *testing.T) {
	r := newRig(t, 0)
	t0 := time.Now()
	d := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sleep", "30"}, DeadlineS: 1})
	if v := wait(t, d); v.Reason != "deadline" || v.Signal != "KILL" || time.Since(t0) > 5*time.Second {
		t.Errorf("deadline: %+v after %v", v, time.Since(t0))
	}
	e := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "exit 7"}})
	if v := wait(t, e); v.ExitCode == nil || *v.ExitCode != 7 || v.Reason != "exit" {
		t.Errorf("exit: %+v", v)
	}
	s := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sleep", "30"}})
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if v := wait(t, s); v.Signal != "TERM" || v.Reason != "signal" || v.ExitCode != nil {
		t.Errorf("signal: %+v", v)
	}
	k := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "setsid sleep 100 & sleep 100 & echo started; wait"}})
	waitFor(t, k, 0, "started")
	tree := k.meta.Tree
	if b, _ := os.ReadFile(tree + "/cgroup.procs"); len(strings.Fields(string(b))) < 3 {
		t.Fatalf("tree %s: %q", tree, b)
	}
	if err := k.Kill(); err != nil {
		t.Fatal(err)
	}
	if v := wait(t, k); v.Reason != "killed" {
		t.Errorf("kill: %+v", v)
	}
	if _, err := os.Stat(tree); !os.IsNotExist(err) {
		t.Errorf("tree cgroup %s still there after kill: %v", tree, err)
	}
}

// TestAdoptAfterRestart: the agent's side goes away (its manager closed)
// while a process prints; a new manager lists it with the same id, and its
// output, written while nobody followed it, is all there.
func TestAdoptAfterRestart(t *testing.T) {
	r := newRig(t, 0)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "i=0; while [ $i -lt 20 ]; do echo n-$i; i=$((i+1)); sleep 0.05; done"}})
	waitFor(t, p, 0, "n-1\n")
	r.m.Close()
	time.Sleep(400 * time.Millisecond)
	q := reopen(t, r, p, func(s string) bool { return s == r.session })
	out, _ := readAll(t, q, 0, 0, 10*time.Second)
	var want strings.Builder
	for i := 0; i < 20; i++ {
		want.WriteString("n-" + strconv.Itoa(i) + "\n")
	}
	if out != want.String() {
		t.Errorf("after re-adoption: %q", out)
	}
	if v := q.View(); v.State != wire.ProcExited || v.PID != p.View().PID {
		t.Errorf("%+v", v)
	}
}

// TestNoLeakedDescriptors: a session process holds its stdio and nothing
// else of its shim's (the holder's pidfd, the run cgroup, the rings, the
// control socket), with or without a terminal.
func TestNoLeakedDescriptors(t *testing.T) {
	r := newRig(t, 0)
	for _, tty := range []*wire.TermSize{nil, {Rows: 10, Cols: 40}} {
		p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "cd /proc/self/fd && echo * && ls -l /proc/self/fd"}, TTY: tty})
		out, _ := readAll(t, p, 0, 0, 10*time.Second)
		t.Logf("%s", out)
		out, _, _ = strings.Cut(out, "\n")
		// sh's glob runs in sh itself: 0 1 2 and the directory it reads.
		if f := strings.Fields(out); len(f) != 4 || f[0] != "0" || f[1] != "1" || f[2] != "2" {
			t.Errorf("tty %v: descriptors %q", tty != nil, out)
		}
	}
}

// TestFollowerHoldsBack: while a live reader follows, a process writing
// faster than it reads waits for it (its output is not dropped, though the
// ring is 40 times smaller than what it writes); when the reader goes,
// nothing holds the process back.
func TestFollowerHoldsBack(t *testing.T) {
	r := newRig(t, 4096)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "read x; head -c 163840 /dev/zero | tr '\\0' x; echo -n END"}, Interactive: true})
	f := p.Follow([2]uint64{0, 0})
	p.Stdin([]byte("go\n"))
	got := readFollowed(t, f, 0, func(ctx context.Context, off uint64) (Chunk, bool, error) {
		time.Sleep(time.Millisecond) // a slow reader
		return p.Next(ctx, 0, off, 1000)
	})
	f.Release()
	if len(got) != 163843 || !strings.HasSuffix(string(got), "xEND") {
		t.Errorf("got %d bytes", len(got))
	}
	// Unfollowed, a writer is never held back.
	q := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "head -c 163840 /dev/zero"}})
	if v := wait(t, q); v.Stdout != 163840 {
		t.Errorf("unfollowed: %+v", v)
	}
}

// TestFollowedStreamExactThroughWraps: varied output (every line differs)
// many times the ring's size, followed, arrives byte for byte, offsets
// contiguous, through every wrap of a 4 KiB ring; and the shim moved it
// with splice (its log says nothing of falling back to read and write).
func TestFollowedStreamExactThroughWraps(t *testing.T) {
	r := newRig(t, 4096)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "read x; seq 1 30000"}, Interactive: true})
	f := p.Follow([2]uint64{0, 0})
	defer f.Release()
	p.Stdin([]byte("go\n"))
	buf := make([]byte, 1500) // not a divisor of the ring: reads straddle wraps
	got := readFollowed(t, f, 0, func(ctx context.Context, off uint64) (Chunk, bool, error) {
		return p.NextInto(ctx, 0, off, buf)
	})
	var want strings.Builder
	for i := 1; i <= 30000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if string(got) != want.String() {
		i := 0
		for i < len(got) && i < want.Len() && got[i] == want.String()[i] {
			i++
		}
		t.Fatalf("got %d bytes, want %d; first difference at %d", len(got), want.Len(), i)
	}
	log, _ := os.ReadFile(filepath.Join(r.cfg.Dir, p.ID(), shimLog))
	if strings.Contains(string(log), "splice") {
		t.Errorf("the shim fell back from splice: %s", log)
	}
}

// TestUnreadStdinHoldsUpNothing: a process that does not read its stdin,
// sent more than a pipe holds, still gets its signals (and its holds and
// kills) at once: stdin waits in the shim's queue, not in the control
// connection.
func TestUnreadStdinHoldsUpNothing(t *testing.T) {
	r := newRig(t, 0)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "echo ready; sleep 100"}, Interactive: true})
	waitFor(t, p, 0, "ready")
	if err := p.Stdin(make([]byte, 512<<10)); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if v := wait(t, p); v.Signal != "TERM" || time.Since(t0) > 3*time.Second {
		t.Errorf("signal behind unread stdin: %+v after %v", v, time.Since(t0))
	}
}

// TestShimKilled: a shim killed from outside leaves its process lost (no
// exit recorded, its output up to then readable), and DELETE still kills
// the process's tree through its cgroup.
func TestShimKilled(t *testing.T) {
	r := newRig(t, 0)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "echo before; exec sleep 100"}})
	waitFor(t, p, 0, "before")
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(p.started.HostPID) + "/status")
	var shim int
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			shim, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if shim <= 1 || shim == os.Getpid() {
		t.Fatalf("shim pid %d", shim)
	}
	syscall.Kill(shim, syscall.SIGKILL) // our child: the test started it
	if v := wait(t, p); v.State != wire.ProcLost {
		t.Fatalf("%+v", v)
	}
	if out, _ := readAll(t, p, 0, 0, 5*time.Second); out != "before\n" {
		t.Errorf("output of a lost process: %q", out)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if b, err := os.ReadFile(p.meta.Tree + "/cgroup.procs"); err != nil || len(b) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Error("the lost process's tree survived DELETE")
}

// TestSparesEndWithTheirManager: the spare shims a manager keeps ready
// exit when it closes (their sockets close), so none outlives its agent;
// and a start after them still works (a shim of its own, or a new spare).
func TestSparesEndWithTheirManager(t *testing.T) {
	r := newRig(t, 0)
	var pids []int
	for i := 0; i < 200 && len(pids) < spareCount; i++ {
		r.m.mu.Lock()
		pids = pids[:0]
		for _, sp := range r.m.spares {
			pids = append(pids, sp.cmd.Process.Pid)
		}
		r.m.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	if len(pids) != spareCount {
		t.Fatalf("%d spares ready, want %d", len(pids), spareCount)
	}
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/echo", "spare"}})
	if out, _ := readAll(t, p, 0, 0, 10*time.Second); out != "spare\n" {
		t.Errorf("through a spare: %q", out)
	}
	r.m.Close()
	for _, pid := range pids {
		gone := false
		for i := 0; i < 100 && !gone; i++ {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			// the one that took the job ended with its process; a reaped
			// or zombie spare reads empty
			gone = err != nil || len(b) == 0 || !strings.Contains(string(b), spareArg)
			time.Sleep(20 * time.Millisecond)
		}
		if !gone {
			t.Errorf("spare %d outlived its manager", pid)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(r.cfg.Dir, spareDirPrefix+"*")); len(left) != 0 {
		t.Errorf("spares' directories left: %v", left)
	}
	m2, err := Open(r.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.m = m2
	q := r.start(t, wire.ProcessStart{Argv: []string{"/bin/echo", "again"}})
	if out, _ := readAll(t, q, 0, 0, 10*time.Second); out != "again\n" {
		t.Errorf("after reopening: %q", out)
	}
}

// TestUnadoptedIsSaid: a process whose ring index cannot be read (a shim
// of an older build had none) is not adopted, and Open says so instead of
// leaving it out without a word.
func TestUnadoptedIsSaid(t *testing.T) {
	r := newRig(t, 0)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "echo up; sleep 30"}})
	waitFor(t, p, 0, "up\n")
	r.m.Close()
	if err := os.Remove(filepath.Join(r.cfg.Dir, p.ID(), indexFile)); err != nil {
		t.Fatal(err)
	}
	m2, err := Open(r.cfg, func(s string) bool { return s == r.session })
	if err != nil {
		t.Fatal(err)
	}
	r.m = m2
	if _, err := m2.Get(r.session, p.ID()); err == nil {
		t.Error("a process without its ring index was adopted")
	}
	u := m2.Unadopted()
	if len(u) != 1 || !strings.Contains(u[0].Error(), p.ID()) {
		t.Errorf("Unadopted() = %v, want the process %s", u, p.ID())
	}
	// The process's shim, whose job then ends, makes a spare's directory
	// again and, finding its manager gone, removes it and exits: wait for
	// that, or the test's directory is removed beside it.
	// By its host pid: View's is the pid in the session's PID namespace.
	p.mu.Lock()
	pid := p.started.HostPID
	p.mu.Unlock()
	shim := parentOf(t, pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Logf("ending the test's process %d: %v", pid, err)
	}
	for i := 0; shim > 0 && syscall.Kill(shim, 0) == nil; i++ {
		if i == 1000 {
			t.Fatalf("the shim %d of an ended process still runs after 10 s", shim)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// parentOf is process pid's parent (0 if it cannot be read).
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// readFollowed reads stream 0 of f's process from off to its end with
// next, advancing f's hold after each chunk; a chunk that does not start
// where the last ended (bytes dropped while followed) fails the test.
func readFollowed(t *testing.T, f *Follower, off uint64, next func(ctx context.Context, off uint64) (Chunk, bool, error)) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []byte
	for {
		c, ok, err := next(ctx, off)
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		if !ok {
			return got
		}
		if c.Offset != off {
			t.Fatalf("dropped %d bytes at %d while followed", c.Offset-off, off)
		}
		got = append(got, c.Data...)
		off += uint64(len(c.Data))
		f.Advance(0, off)
	}
}
