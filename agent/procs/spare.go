//go:build unix

package procs

// Spare shims: a shim's own start (exec of a Go binary, its runtime and
// package initialisation: 4–12 ms here, most of a start's time to the
// first output byte) is paid before a start is asked for. The manager
// keeps spareCount shims started and waiting, each on its own end of a
// socket pair (fd 3); a start hands one its job (the process's directory,
// and as descriptors the status pipe, the shim's log and the prepared
// launch's) and starts a replacement in the background. A spare whose
// socket closes (the manager closed, the agent gone, even by kill -9)
// exits: none outlives its agent. A start that finds no spare starts a
// shim of its own, as before.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// spareCount spares are kept ready: one start at a time always finds one
// that has finished starting; a burst takes them all and the rest start
// shims of their own.
const spareCount = 2

// maxJobFiles bounds the descriptors of one job (status, log, the
// prepared launch's).
const maxJobFiles = 16

type spare struct {
	cmd  *exec.Cmd
	conn *net.UnixConn
}

// startSpare starts one spare shim (not waiting for it to be ready: a job
// sent early waits in its socket until it is).
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
	cmd := &exec.Cmd{Path: m.cfg.Shim, Args: []string{ShimArg0, m.cfg.Dir, spareArg}, Env: []string{"GOMAXPROCS=2"},
		ExtraFiles: []*os.File{theirs}, SysProcAttr: shimAttr()}
	if err := cmd.Start(); err != nil {
		c.Close()
		return nil, fmt.Errorf("procs: start spare shim: %w", err)
	}
	go cmd.Wait() // reap it when it ends
	return &spare{cmd: cmd, conn: c.(*net.UnixConn)}, nil
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
		m.mu.Unlock()
		if sp != nil {
			sp.conn.Close() // the manager closed meanwhile: it exits
		}
		if err != nil {
			return // the next start tries again
		}
	}
}

// takeSpare returns a spare (nil: none). The caller starts its
// replacement (refill) once its own start is done: a shim starting beside
// it would take CPU from it.
func (m *Manager) takeSpare() *spare {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sp *spare
	if n := len(m.spares); n > 0 {
		sp, m.spares = m.spares[n-1], m.spares[:n-1]
	}
	return sp
}

// closeSpares ends the spares (their sockets close: they exit).
func (m *Manager) closeSpares() {
	m.mu.Lock()
	sps := m.spares
	m.spares, m.closed = nil, true
	m.mu.Unlock()
	for _, sp := range sps {
		sp.conn.Close()
	}
}

// handJob sends a spare its job: dir, then as descriptors the status pipe,
// the shim's log and the prepared launch's. The spare owns its copies
// once this returns nil.
func (sp *spare) handJob(dir string, status, log *os.File, files []*os.File) error {
	defer sp.conn.Close() // one job per spare
	fds := []int{int(status.Fd()), int(log.Fd())}
	for _, f := range files {
		fds = append(fds, int(f.Fd()))
	}
	if len(fds) > maxJobFiles {
		return fmt.Errorf("procs: %d descriptors for a shim (at most %d)", len(fds), maxJobFiles)
	}
	_, _, err := sp.conn.WriteMsgUnix([]byte(dir), unix.UnixRights(fds...), nil)
	return err
}

// runSpare is a spare shim: it waits for its job on fd 3 and runs it (or
// exits, its socket closed with no job).
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
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*maxJobFiles))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	uc.Close()
	if err != nil || n == 0 {
		return 0 // closed with no job
	}
	fds, err := parseRights(oob[:oobn])
	if err != nil || len(fds) < 2 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return 1
	}
	status, log := os.NewFile(uintptr(fds[0]), "status"), os.NewFile(uintptr(fds[1]), "log")
	// The log becomes the shim's stdout and stderr, as a shim started for
	// its job has them.
	for _, to := range []int{1, 2} {
		if err := dupTo(int(log.Fd()), to); err != nil {
			fmt.Fprintf(status, "procs: spare shim: log: %v", err)
			return 1
		}
	}
	log.Close()
	files := []*os.File{}
	for _, fd := range fds[2:] {
		files = append(files, os.NewFile(uintptr(fd), "prepared"))
	}
	dir := string(buf[:n])
	if !filepath.IsAbs(dir) {
		fmt.Fprintf(status, "procs: spare shim: bad directory %q", dir)
		return 1
	}
	return runShim(start, dir, status, files)
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
