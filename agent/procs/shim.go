package procs

// The shim: one small process per session process, started by the agent
// in its own session (setsid) and never waited for by anything that dies
// with the agent. It starts the prepared launch (it is the process's
// parent, so it alone reaps its exit status), holds its stdio or terminal,
// writes its output to the two rings in the process's directory, serves
// the agent's control connections (stdin, resize, signals), enforces the
// process's deadline, and when the process ends kills what is left of its
// tree, records the exit in exit.json and exits.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
)

// ShimArg0 is argv[0] of a binary re-executed as a shim; argv[1] is the
// process's directory, fd 3 its status pipe, fds 4... the prepared
// launch's descriptors.
const ShimArg0 = "shinken-process-shim"

// ShimMain runs the shim when this binary was started as one and never
// returns then; in any other process it returns at once. The agent's
// binary (and test binaries that start processes) call it first thing,
// with the backend's StartFunc.
func ShimMain(start backend.StartFunc) {
	if len(os.Args) != 2 || os.Args[0] != ShimArg0 || start == nil {
		return
	}
	os.Exit(runShim(start, os.Args[1]))
}

type shim struct {
	dir  string
	meta meta

	mu     sync.Mutex
	rings  [2]*ringWriter
	conns  map[chan struct{}]bool
	exit   *exitRecord
	stdin  io.WriteCloser // nil: closed or none
	pty    *os.File
	proc   *os.Process
	reason string // set by a deadline or a kill before the process ends
	// in queues stdin for stdinLoop, so that a process that does not read
	// its stdin holds up no control frame (a hold, a signal, a kill).
	in struct {
		mu    sync.Mutex
		cond  *sync.Cond
		q     []stdinItem
		bytes int
	}
	// holds: per control connection, the offsets of the slowest reader
	// it follows live (ctlHold); a pump does not read more than its ring
	// can keep past them, so the process waits for an attached client
	// instead of its output being dropped. Gone with the connection.
	holds map[net.Conn][2]uint64
	room  *sync.Cond // on mu: a hold moved or went
	ended bool       // the process ended long ago: holds no longer count
}

func runShim(start backend.StartFunc, dir string) int {
	// Caught, not ignored: an ignored signal stays ignored in the process
	// the shim starts (a shell's ^C would then reach nothing).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT)
	// Whatever the shim inherited beyond its stdio (the status pipe, the
	// prepared launch's descriptors, anything the agent itself inherited
	// without close-on-exec) reaches the launcher only where StartFunc
	// passes it, never the session process.
	closeOnExecFrom(3)
	status := os.NewFile(3, "status")
	report := func(err error) int {
		if err != nil {
			fmt.Fprintf(status, "%v", err)
			status.Close()
			return 1
		}
		status.Write([]byte("ok"))
		status.Close()
		return 0
	}
	s := &shim{dir: dir, conns: map[chan struct{}]bool{}, holds: map[net.Conn][2]uint64{}}
	s.room = sync.NewCond(&s.mu)
	if err := readJSON(filepath.Join(dir, metaFile), &s.meta); err != nil {
		return report(err)
	}
	var files []*os.File
	for i := 0; i < s.meta.Files; i++ {
		files = append(files, os.NewFile(uintptr(4+i), "prepared"))
	}
	for i, name := range []string{outFile, errFile} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return report(err)
		}
		s.rings[i] = &ringWriter{f: f, cap: s.meta.RingBytes}
	}
	ln, err := net.Listen("unix", filepath.Join(dir, ctlFile))
	if err != nil {
		return report(err)
	}
	req := backend.StartRequest{Args: s.meta.Prepared, Files: files}
	var pumps []io.Reader
	var childEnds []*os.File
	if s.meta.TTY != nil {
		req.TTY, req.Rows, req.Cols = true, s.meta.TTY.Rows, s.meta.TTY.Cols
	} else {
		if s.meta.Stdin != nil || s.meta.Interactive {
			r, w, err := os.Pipe()
			if err != nil {
				return report(err)
			}
			req.Stdin, s.stdin = r, w
			childEnds = append(childEnds, r)
		} else if req.Stdin, err = os.Open(os.DevNull); err != nil {
			return report(err)
		}
		for i := 0; i < 2; i++ {
			r, w, err := os.Pipe()
			if err != nil {
				return report(err)
			}
			pumps = append(pumps, r)
			childEnds = append(childEnds, w)
		}
		req.Stdout, req.Stderr = childEnds[len(childEnds)-2], childEnds[len(childEnds)-1]
	}
	st, err := start(req)
	for _, f := range append(childEnds, files...) {
		f.Close()
	}
	if req.Stdin != nil {
		req.Stdin.Close()
	}
	if err != nil {
		return report(err)
	}
	s.proc = st.Process
	if st.PTY != nil {
		s.pty, s.stdin = st.PTY, st.PTY
		pumps = []io.Reader{st.PTY}
	}
	started := startedRecord{HostPID: st.Process.Pid, PID: nsPID(st.Process.Pid), Started: time.Now().UTC()}
	if err := writeJSON(filepath.Join(dir, startedFile), started); err != nil {
		s.killTree()
		st.Process.Wait()
		return report(err)
	}
	report(nil)

	go s.serve(ln)
	if s.meta.Deadline != nil {
		time.AfterFunc(time.Until(*s.meta.Deadline), func() { s.kill("deadline") })
	}
	s.in.cond = sync.NewCond(&s.in.mu)
	go s.stdinLoop()
	if s.meta.Stdin != nil {
		s.queueStdin(s.meta.Stdin, false)
	}
	if !s.meta.Interactive && s.pty == nil && s.stdin != nil {
		s.queueStdin(nil, true)
	}
	var wg sync.WaitGroup
	for i, r := range pumps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.pump(i, r)
		}()
	}
	ps, _ := st.Process.Wait()
	// What the first process leaves behind ends with it (as a run's does),
	// so nothing holds the pipes or the terminal open.
	s.killTree()
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	// A live reader that holds the pumps back gets 30 s to catch up (what
	// is left is at most a pipe's buffer); then the pumps go on regardless.
	select {
	case <-drained:
	case <-time.After(30 * time.Second):
		s.mu.Lock()
		s.ended = true
		s.room.Broadcast()
		s.mu.Unlock()
		select {
		case <-drained:
		case <-time.After(5 * time.Second):
		}
	}
	s.mu.Lock()
	rec := exitRecord{Ended: time.Now().UTC(), Reason: s.reason, Stdout: s.rings[0].end, Stderr: s.rings[1].end}
	s.mu.Unlock()
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		rec.Signal = signalName(ws.Signal())
		if rec.Reason == "" {
			rec.Reason = "signal"
		}
	} else {
		code := ps.ExitCode()
		rec.ExitCode = &code
		if rec.Reason == "" {
			rec.Reason = "exit"
		}
	}
	// The tree is gone (killed above, its cgroup removed) before the exit
	// is recorded: a process listed as exited has left nothing behind.
	removeTree(s.meta.Tree)
	err = writeJSON(filepath.Join(dir, exitFile), rec)
	s.mu.Lock()
	s.exit = &rec
	for c := range s.conns {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	time.Sleep(200 * time.Millisecond) // let connected agents read the exit
	if err != nil {
		return 1
	}
	return 0
}

// pump copies one output stream into its ring (a terminal's into stdout).
func (s *shim) pump(i int, r io.Reader) {
	buf := make([]byte, min(64<<10, s.meta.RingBytes))
	for {
		s.mu.Lock()
		for s.held(i, uint64(len(buf))) {
			s.room.Wait()
		}
		s.mu.Unlock()
		n, err := r.Read(buf)
		if n > 0 {
			s.mu.Lock()
			werr := s.rings[i].write(buf[:n])
			for c := range s.conns {
				select {
				case c <- struct{}{}:
				default:
				}
			}
			s.mu.Unlock()
			if werr != nil {
				fmt.Fprintf(os.Stderr, "shim: ring %d: %v\n", i, werr)
			}
		}
		if err != nil { // EOF, or EIO once a terminal's last slave closed
			return
		}
	}
}

type stdinItem struct {
	data  []byte
	close bool // end of file (^D at a terminal)
}

// maxQueuedStdin bounds the stdin queued for a process that does not read
// it; past it the control connection waits (the client's stdin with it).
const maxQueuedStdin = 16 << 20

func (s *shim) queueStdin(b []byte, close bool) {
	s.in.mu.Lock()
	defer s.in.mu.Unlock()
	for s.in.bytes > maxQueuedStdin {
		s.in.cond.Wait()
	}
	s.in.q = append(s.in.q, stdinItem{data: b, close: close})
	s.in.bytes += len(b)
	s.in.cond.Broadcast()
}

// stdinLoop writes the queued stdin to the process, in order.
func (s *shim) stdinLoop() {
	for {
		s.in.mu.Lock()
		for len(s.in.q) == 0 {
			s.in.cond.Wait()
		}
		it := s.in.q[0]
		s.in.q = s.in.q[1:]
		s.in.mu.Unlock()
		switch {
		case s.stdin == nil:
		case it.close && s.pty != nil:
			s.pty.Write([]byte{4}) // ^D: end of file at the terminal's line discipline
		case it.close:
			s.stdin.Close()
			s.stdin = nil
		default:
			s.stdin.Write(it.data) // EPIPE once the process has gone
		}
		s.in.mu.Lock()
		s.in.bytes -= len(it.data)
		s.in.cond.Broadcast()
		s.in.mu.Unlock()
	}
}

// held says whether writing n more bytes to ring i would overwrite bytes a
// live reader has not read yet; s.mu held.
func (s *shim) held(i int, n uint64) bool {
	if s.ended {
		return false
	}
	for _, h := range s.holds {
		if s.rings[i].end+n > h[i]+s.rings[i].cap {
			return true
		}
	}
	return false
}

// serve takes the agent's control connections (one per agent that runs;
// a restarted agent connects again).
func (s *shim) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.conn(c)
	}
}

func (s *shim) conn(c net.Conn) {
	defer c.Close()
	note := make(chan struct{}, 1)
	note <- struct{}{}
	s.mu.Lock()
	s.conns[note] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, note)
		close(note)
		delete(s.holds, c) // the agent went away: nothing holds the process back
		s.room.Broadcast()
		s.mu.Unlock()
	}()
	go func() { // the writer: the latest ends, then the exit
		for range note {
			s.mu.Lock()
			var e [16]byte
			binary.BigEndian.PutUint64(e[:8], s.rings[0].end)
			binary.BigEndian.PutUint64(e[8:], s.rings[1].end)
			exit := s.exit
			s.mu.Unlock()
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if writeFrame(c, ctlEnds, e[:]) != nil {
				c.Close()
				return
			}
			if exit != nil {
				js, _ := json.Marshal(exit)
				writeFrame(c, ctlExit, js)
				c.Close()
				return
			}
		}
	}()
	for {
		typ, p, err := readFrame(c)
		if err != nil {
			return
		}
		switch typ {
		case ctlHold:
			s.mu.Lock()
			if len(p) == 16 {
				s.holds[c] = [2]uint64{binary.BigEndian.Uint64(p), binary.BigEndian.Uint64(p[8:])}
			} else {
				delete(s.holds, c)
			}
			s.room.Broadcast()
			s.mu.Unlock()
		case ctlStdin:
			s.queueStdin(p, false)
		case ctlStdinClose:
			s.queueStdin(nil, true)
		case ctlResize:
			var ts wire.TermSize
			if json.Unmarshal(p, &ts) == nil && s.pty != nil {
				setTermSize(s.pty, ts)
			}
		case ctlSignal:
			if len(p) == 4 {
				sig := binary.BigEndian.Uint32(p)
				if sig == killTreeSignal {
					s.kill("killed")
				} else {
					s.proc.Signal(syscall.Signal(sig))
				}
			}
		}
	}
}

// killTreeSignal, sent as a signal number, asks the shim to kill the
// process's whole tree (DELETE).
const killTreeSignal = 0xffffffff

func (s *shim) kill(reason string) {
	s.mu.Lock()
	if s.exit == nil && s.reason == "" {
		s.reason = reason
	}
	s.mu.Unlock()
	s.killTree()
}

func (s *shim) killTree() {
	if s.meta.Tree == "" || os.WriteFile(filepath.Join(s.meta.Tree, "cgroup.kill"), []byte("1"), 0) != nil {
		s.proc.Kill()
	}
}

// removeTree removes the process's (now empty) cgroup.
func removeTree(dir string) {
	if dir == "" {
		return
	}
	for i := 0; i < 200; i++ {
		if err := rmdir(dir); err == nil || !errors.Is(err, errBusy) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nsPID is pid's number in its own (the session's) PID namespace: the
// last NSpid field in /proc/PID/status; 0 if unknown.
func nsPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			v, _ := strconv.Atoi(f[len(f)-1])
			return v
		}
	}
	return 0
}
