//go:build unix

package procs

// Spare shims: a shim's own start (exec of a Go binary, its runtime and
// package initialisation) and the files it makes (a directory, two ring
// files, the ring index, its log, its control socket and the started
// record's temporary file: file creations cost 0.03–1 ms
// each on this machine's ext4, depending on the disk's other work) are
// paid before a start is asked for. The manager keeps spareCount shims
// ready, each in a directory of its own (STATE_DIR/procs/.spare-RANDOM)
// holding those files, and waiting on its end of a socket pair (fd 3). A
// start renames a spare's directory to the process's (the open rings and
// the bound socket move with it), writes meta.json there, and hands the
// spare its job: the directory's new name and, as descriptors, the status
// pipe and the prepared launch's; a replacement starts once the start is
// done, unless enough spares are kept. The agent keeps the socket: a spare
// whose job has ended cleanly makes a new directory and says it is ready
// again, and is taken back while fewer than maxSpares are kept (runSpare,
// awaitReturn), so that a shim's start is paid once for many short
// processes. A spare whose socket closes with no job (the manager closed,
// the agent gone, even by kill -9) removes its directory and exits: none
// outlives its agent.
//
// A start that finds none ready waits for one still starting, where one
// is not already waited for by another start (it has done part of its
// start, and the wait runs beside the door's record being made durable);
// with none starting, or that spare failed, it starts a shim of its own.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// spareCount spares are kept ready: starts one after another find one
// that has finished starting; a burst takes them all and the rest wait for
// one still starting or start shims of their own. They are made one at a
// time, each once a start is done: on a loaded host a spare's start (a Go
// binary's exec and runtime start, 30 ms median and 55-65 ms p90 at load
// 8 on 2 vCPUs) took about as long as a start and the next request, and
// with two kept most starts waited for one (median 7-10 ms, p90 43-50 ms;
// with four: 0 and 9; bench/README.md, issue 20). Each idle spare holds
// about 1.0 MiB (Pss; 1.6 before cmd/shinken-shim was static and linked
// only the boundary's prepared launches).
const spareCount = 4

// maxJobFiles bounds the descriptors of one job (status and the prepared
// launch's).
const maxJobFiles = 16

// spareDirPrefix names a spare's directory in the processes' directory.
const spareDirPrefix = ".spare-"

type spare struct {
	cmd    *exec.Cmd
	conn   *net.UnixConn
	dir    string
	exited chan struct{} // closed once the shim has exited and been reaped
}

// startSpare starts one spare shim and waits until it is ready (its
// directory made).
func (m *Manager) startSpare() (*spare, error) {
	fds, err := seqpacketPair()
	if err != nil {
		return nil, err
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "spare"), os.NewFile(uintptr(fds[1]), "spare")
	defer theirs.Close()
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, err
	}
	sp := &spare{conn: c.(*net.UnixConn), dir: filepath.Join(m.cfg.Dir, spareDirPrefix+newID()[2:])}
	sp.cmd = &exec.Cmd{Path: m.cfg.Shim, Args: []string{ShimArg0, sp.dir, spareArg}, Env: []string{shimEnv},
		ExtraFiles: []*os.File{theirs}, SysProcAttr: shimAttr()}
	if err := sp.cmd.Start(); err != nil {
		c.Close()
		return nil, fmt.Errorf("procs: start spare shim: %w", err)
	}
	sp.exited = make(chan struct{})
	go func() { sp.cmd.Wait(); close(sp.exited) }() // reap it when it ends
	pid := sp.cmd.Process.Pid
	m.mu.Lock()
	m.starting[pid] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.starting, pid)
		m.mu.Unlock()
	}()
	sp.conn.SetReadDeadline(time.Now().Add(m.cfg.StartTimeout))
	dir, err := m.readReady(sp.conn)
	if err != nil || dir != sp.dir {
		sp.abandon()
		return nil, fmt.Errorf("procs: spare shim not ready: %v (directory %q)", err, dir)
	}
	sp.conn.SetReadDeadline(time.Time{})
	return sp, nil
}

// readReady reads a spare's "ready" on c: "r" and its directory, which
// must be a spare's directory in the processes' directory.
func (m *Manager) readReady(c *net.UnixConn) (string, error) {
	b := make([]byte, 4096)
	n, err := c.Read(b)
	if err != nil {
		return "", err
	}
	dir, ok := strings.CutPrefix(string(b[:n]), "r")
	if !ok || filepath.Dir(dir) != m.cfg.Dir || !strings.HasPrefix(filepath.Base(dir), spareDirPrefix) {
		return "", fmt.Errorf("bad ready message %q", b[:n])
	}
	return dir, nil
}

// spareIdleFree is how long a spare waits for a job before it returns its
// free heap to the system (runSpare).
const spareIdleFree = 5 * time.Second

// maxSpares bounds the spares kept, those started ahead of need and those
// back from a job: a shim whose job has ended is taken back while fewer
// are kept, so that short processes started one after another reuse a
// few shims instead of starting one each (runSpare); past it, it exits.
const maxSpares = 2 * spareCount

// awaitReturn waits, beside sp's job, for sp to say it is ready again (its
// job ended cleanly) and keeps it as a spare, or closes its socket (enough
// spares, the manager closed, or a bad message): it then exits. A shim
// that ends with its job closes the socket itself.
func (m *Manager) awaitReturn(sp *spare) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		sp.conn.Close()
		return
	}
	m.working[sp] = true
	m.mu.Unlock()
	go func() {
		dir, err := m.readReady(sp.conn)
		m.mu.Lock()
		delete(m.working, sp)
		keep := err == nil && !m.closed && len(m.spares) < maxSpares
		if keep {
			sp.dir = dir
			m.spares = append(m.spares, sp)
			m.reused++
			m.spareCond.Broadcast()
		}
		m.mu.Unlock()
		if !keep {
			sp.conn.Close() // it removes its directory and exits
		}
	}()
}

// abandon ends a spare that will get no job and removes its directory
// once it has exited (a shim killed mid-way through a file creation
// finishes that creation first).
func (sp *spare) abandon() {
	sp.conn.Close()
	sp.cmd.Process.Kill()
	sp.waitExit()
	os.RemoveAll(sp.dir)
}

// spareExitWait bounds how long Close waits for a spare to exit after its
// socket closed (it removes its directory first), before it kills it.
const spareExitWait = 5 * time.Second

// waitExit waits until the spare's process has exited, killing it if it
// has not within spareExitWait.
func (sp *spare) waitExit() {
	select {
	case <-sp.exited:
	case <-time.After(spareExitWait):
		sp.cmd.Process.Kill()
		<-sp.exited
	}
}

// refill starts spares until spareCount are kept (or the manager closed).
func (m *Manager) refill() {
	for {
		m.mu.Lock()
		if m.closed || len(m.spares)+m.spareStarting >= spareCount {
			m.mu.Unlock()
			return
		}
		m.spareStarting++
		m.mu.Unlock()
		sp, err := m.startSpare()
		m.mu.Lock()
		m.spareStarting--
		if err == nil && !m.closed {
			m.spares = append(m.spares, sp)
			sp = nil
		}
		m.spareCond.Broadcast() // a waiting start takes it, or starts its own
		m.mu.Unlock()
		if sp != nil {
			sp.abandon() // the manager closed meanwhile
		}
		if err != nil {
			return // the next start tries again
		}
	}
}

// takeSpare returns a spare (nil: none), waiting for one still starting
// when none is ready and a starting one is not waited for by another
// start. The caller starts its replacement (refill) once its own start is
// done: a shim starting beside it would take CPU from it.
func (m *Manager) takeSpare() *spare {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		if n := len(m.spares); n > 0 {
			sp := m.spares[n-1]
			m.spares = m.spares[:n-1]
			return sp
		}
		if m.closed || m.spareStarting <= m.spareWaiters {
			return nil
		}
		m.spareWaiters++
		m.spareCond.Wait() // bounded: a spare is ready or abandoned within StartTimeout
		m.spareWaiters--
	}
}

// closeSpares ends the spares (their sockets close: they exit).
func (m *Manager) closeSpares() {
	m.mu.Lock()
	sps := m.spares
	m.spares, m.closed = nil, true
	for sp := range m.working {
		sp.conn.Close() // its job runs on; then it exits
	}
	m.mu.Unlock()
	for _, sp := range sps {
		sp.conn.Close() // it removes its directory and exits
	}
	m.spareCond.Broadcast()
	// Nothing of a spare outlives Close: each removes its directory and
	// exits (waited for), and a refill still starting one abandons it. A
	// shim at its job is not waited for (its process runs on): if its job
	// ends after this, it may stage a directory, finds its socket closed,
	// removes it and exits.
	for _, sp := range sps {
		sp.waitExit()
		os.RemoveAll(sp.dir) // gone already, unless it was killed
	}
	m.refills.Wait()
}

// take renames the spare's directory to dir, the process's.
func (sp *spare) take(dir string) error {
	if err := os.Rename(sp.dir, dir); err != nil {
		sp.abandon()
		return err
	}
	sp.dir = dir
	return nil
}

// handJob sends a spare (its directory renamed to dir) its job: dir, then
// as descriptors the status pipe and the prepared launch's. The spare owns
// its copies once this returns nil.
func (sp *spare) handJob(dir string, status *os.File, files []*os.File) error {
	fds := []int{int(status.Fd())}
	for _, f := range files {
		fds = append(fds, int(f.Fd()))
	}
	if len(fds) > maxJobFiles {
		sp.conn.Close()
		return fmt.Errorf("procs: %d descriptors for a shim (at most %d)", len(fds), maxJobFiles)
	}
	_, _, err := sp.conn.WriteMsgUnix([]byte(dir), unix.UnixRights(fds...), nil)
	if err != nil {
		sp.conn.Close()
	}
	return err
}

// runSpare is a spare shim: it makes its directory (argv[1]) and what a
// shim makes there, says it is ready on fd 3 ("r" and the directory), and
// waits there for its job and runs it (or, the socket closed with no job,
// removes the directory and exits). Once a job has ended cleanly (its
// process gone, its exit recorded, nothing of it held: runShim) it makes a
// new directory and says it is ready again: the agent takes it back as a
// spare, or closes the socket (enough spares, or the agent gone: even a
// restarted agent has none of the old one's sockets), and it exits. The
// shim's own start, a Go binary's exec and runtime set-up, is then paid
// once for many short processes instead of once each.
func runSpare(start backend.StartFunc) int {
	closeOnExecFrom(3)
	f := os.NewFile(3, "spare")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return 1
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 1
	}
	defer uc.Close()
	staging := os.Args[1]
	if !filepath.IsAbs(staging) || !strings.HasPrefix(filepath.Base(staging), spareDirPrefix) || os.Mkdir(staging, 0o700) != nil {
		return 1
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*maxJobFiles))
	for first := true; ; first = false {
		pre, err := stageSpare(staging)
		if err != nil {
			os.RemoveAll(staging)
			return 1
		}
		if first {
			warmShim()
		}
		if _, err := uc.Write(append([]byte{'r'}, staging...)); err != nil {
			os.RemoveAll(staging)
			return 0
		}
		// A spare left idle for spareIdleFree returns its free heap to the
		// system once: a shim back from many jobs holds a few MiB of heap
		// the runtime keeps for the next (6 MiB anonymous against 1.5 for
		// a fresh spare, after 300 jobs); a busy one keeps it, so that a
		// job does not fault those pages in again.
		uc.SetReadDeadline(time.Now().Add(spareIdleFree))
		n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			debug.FreeOSMemory()
			uc.SetReadDeadline(time.Time{})
			n, oobn, _, _, err = uc.ReadMsgUnix(buf, oob)
		}
		if err != nil || n == 0 {
			os.RemoveAll(staging) // closed with no job
			return 0
		}
		fds, err := parseRights(oob[:oobn])
		if err != nil || len(fds) < 1 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return 1
		}
		status := os.NewFile(uintptr(fds[0]), "status")
		files := []*os.File{}
		for _, fd := range fds[1:] {
			files = append(files, os.NewFile(uintptr(fd), "prepared"))
		}
		dir := string(buf[:n])
		if !filepath.IsAbs(dir) || filepath.Dir(dir) != filepath.Dir(staging) {
			fmt.Fprintf(status, "procs: spare shim: bad directory %q", dir)
			return 1
		}
		code, released := runShim(start, dir, status, files, pre, true)
		if !released {
			return code
		}
		staging = filepath.Join(filepath.Dir(dir), spareDirPrefix+newID()[2:])
		if os.Mkdir(staging, 0o700) != nil {
			return 0
		}
	}
}

// stageSpare makes a spare's files in its directory: its log (its stdout
// and stderr from now on, as a shim started for its job has them), the
// rings and the control socket.
func stageSpare(dir string) (*staged, error) {
	log, err := os.OpenFile(filepath.Join(dir, shimLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	for _, to := range []int{1, 2} {
		if err := dupTo(int(log.Fd()), to); err != nil {
			return nil, err
		}
	}
	return stage(dir)
}

// parseRights returns the descriptors in a message's control data, each
// marked close-on-exec.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != syscall.SOL_SOCKET || msgs[i].Header.Type != syscall.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	if len(fds) == 0 {
		return nil, errors.New("no descriptors")
	}
	return fds, nil
}

// warmShim does ahead, in a spare, the first-time work of a job's first
// steps: the signal handlers runShim installs (signal.Notify starts the
// runtime's signal loop on its first call) and encoding/json's per-type
// set-up for meta.json and the records the shim writes. Done after the job
// came, it was most of the 0.6-0.9 ms (median; p90 3-13 ms at load 8-12) from
// the job to meta.json read; done here, 0.2 (p90 0.3) (bench/README.md,
// issue 20).
func warmShim() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT)
	var md meta
	_ = json.Unmarshal([]byte(`{"id":"p-0","session":"s","argv":["x"],"tty":{"rows":1,"cols":1},"deadline":"2026-01-01T00:00:00Z","created":"2026-01-01T00:00:00Z","prepared":["a"],"files":1}`), &md)
	_, _ = json.Marshal(startedRecord{})
	_, _ = json.Marshal(exitRecord{})
	// The os package checks once per process that pidfds work, with a
	// clone of its own (a child that exits at once): here, not at the
	// job's launch.
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		p.Release()
	}
}
