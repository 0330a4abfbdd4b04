package procs

// The shim: one small process per session process, started by the agent
// in its own session (setsid) and never waited for by anything that dies
// with the agent. It starts the prepared launch (it is the process's
// parent, so it alone reaps its exit status), holds its stdio or terminal,
// writes its output to the two rings in the process's directory, serves
// the agent's control connections (stdin, resize, signals), enforces the
// process's deadline, and when the process ends kills what is left of its
// tree, records the exit in exit.json and exits (a spare shim instead lets
// go of the job and waits for another: spare.go).

import (
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

	"github.com/shinken-agent/shinken/agent/backend"
)

// ShimArg0 is argv[0] of a binary re-executed as a shim; argv[1] is the
// process's directory, fd 3 its status pipe, fds 4... the prepared
// launch's descriptors. A spare shim (spare.go) has argv[1] a directory of
// its own (STATE_DIR/procs/.spare-*), argv[2] spareArg, and gets the
// process's directory and descriptors later over fd 3, a socket.
const ShimArg0 = "shinken-process-shim"

const spareArg = "spare"

// reportOK begins a shim's report of a start on its status pipe; the
// started record (JSON) follows. Anything else is why it failed.
const reportOK = "ok\n"

// execReports: the line that begins a report of a start whose program
// could not be executed, for each kind of that failure (the request's
// fault, which the agent answers as such); the error's text follows. The
// shim writes them, the agent's startShim reads them.
var execReports = []struct {
	prefix string
	kind   error
}{{"exec-failed\n", backend.ErrExecFailed}, {"exec-denied\n", backend.ErrExecDenied}}

// shimEnv is a shim's whole environment. A shim relays bytes between
// descriptors and computes nothing: with one P its goroutines (the pumps,
// the control connections' readers and writers) hand work to each other
// on one thread instead of waking others, which was most of its CPU time
// while a fast writer streamed (bench/README.md); and the runtime does not
// size itself from the cgroup at start.
const shimEnv = "GOMAXPROCS=1"

// ShimMain runs the shim when this binary was started as one and never
// returns then; in any other process it returns at once. The agent's
// binary (and test binaries that start processes) call it first thing,
// with the backend's StartFunc.
func ShimMain(start backend.StartFunc) {
	if len(os.Args) < 2 || os.Args[0] != ShimArg0 || start == nil {
		return
	}
	switch {
	case len(os.Args) == 2:
		// Whatever the shim inherited beyond its stdio (the status pipe, the
		// prepared launch's descriptors, anything the agent itself inherited
		// without close-on-exec) reaches the launcher only where StartFunc
		// passes it, never the session process.
		closeOnExecFrom(3)
		code, _ := runShim(start, os.Args[1], os.NewFile(3, "status"), nil, nil, false)
		os.Exit(code)
	case len(os.Args) == 3 && os.Args[2] == spareArg:
		os.Exit(runSpare(start))
	}
}

// CloseInheritedFDs marks every descriptor from 3 up close-on-exec. The
// agent calls it first thing in its daemon mode (after ShimMain and the
// boundary's re-executed modes, which use the descriptors they are given):
// whatever its own parent left open without close-on-exec (a pipe, a log
// file, a socket, a directory) then reaches none of the processes it
// starts (shims, session holders, helpers); it uses no inherited
// descriptor itself (no socket activation). The session launchers close
// such descriptors again at exec (package boundary), for library users
// that do not call this.
func CloseInheritedFDs() { closeOnExecFrom(3) }

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
	// deadline kills the process when its deadline passes (nil: none);
	// set and stopped by runShim's goroutine alone (release).
	deadline *time.Timer
	// in queues stdin for stdinLoop, so that a process that does not read
	// its stdin holds up no control frame (a hold, a signal, a kill).
	in struct {
		mu    sync.Mutex
		cond  *sync.Cond
		q     []stdinItem
		bytes int
		done  bool // the job is released: stdinLoop drains the queue and ends
	}
	// holds: per control connection, the offsets of the slowest reader
	// it follows live (ctlHold); a pump does not read more than its ring
	// can keep past them, so the process waits for an attached client
	// instead of its output being dropped. Gone with the connection.
	holds map[net.Conn][2]uint64
	room  *sync.Cond // on mu: a hold moved or went
	ended bool       // the process ended long ago: holds no longer count
}

// catchSignals makes SIGHUP and SIGINT caught, not ignored, once per shim:
// an ignored signal stays ignored in the process the shim starts (a
// shell's ^C would then reach nothing).
var catchSignals = sync.OnceFunc(func() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT)
})

// runShim holds the process of directory dir: status is where it reports
// its start; files are the prepared launch's descriptors (nil: inherited
// at fds 4..., as many as meta.json says); pre, from a spare, its rings and
// listener (nil: made here). It returns the shim's exit code, and whether
// it released the job (reuse set, the job ended cleanly): nothing of the
// job is left in the shim then, and a spare takes another job (spare.go)
// instead of exiting.
func runShim(start backend.StartFunc, dir string, status *os.File, files []*os.File, pre *staged, reuse bool) (int, bool) {
	catchSignals()
	report := func(err error) (int, bool) {
		if err != nil {
			prefix := ""
			for _, k := range execReports {
				if errors.Is(err, k.kind) {
					prefix = k.prefix
					break
				}
			}
			fmt.Fprintf(status, "%s%v", prefix, err)
			status.Close()
			return 1, false
		}
		status.Close()
		return 0, false
	}
	s := &shim{dir: dir, conns: map[chan struct{}]bool{}, holds: map[net.Conn][2]uint64{}}
	s.room = sync.NewCond(&s.mu)
	if err := readJSON(filepath.Join(dir, metaFile), &s.meta); err != nil {
		return report(err)
	}
	if files == nil {
		for i := 0; i < s.meta.Files; i++ {
			files = append(files, os.NewFile(uintptr(4+i), "prepared"))
		}
	}
	if len(files) != s.meta.Files {
		return report(fmt.Errorf("procs: shim got %d descriptors, the prepared launch has %d", len(files), s.meta.Files))
	}
	if pre == nil {
		var err error
		if pre, err = stage(dir); err != nil {
			return report(err)
		}
	}
	for i, f := range pre.rings {
		s.rings[i] = &ringWriter{f: f, cap: s.meta.RingBytes, idx: pre.idx, i: i}
	}
	ln := pre.ln
	var err error
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
			growPipe(r, pipeBytes)
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
	if err := writeJSONInto(pre.started, filepath.Join(dir, startedFile), started); err != nil {
		s.killTree()
		st.Process.Wait()
		return report(err)
	}
	// The report carries the record just written (the agent does not read
	// it back).
	js, _ := json.Marshal(started)
	status.Write(append([]byte(reportOK), js...))
	report(nil)

	go s.serve(ln)
	if s.meta.Deadline != nil {
		s.deadline = time.AfterFunc(time.Until(*s.meta.Deadline), func() { s.kill("deadline") })
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
	awaitExit(st.Process.Pid)
	ps, _ := st.Process.Wait()
	// What the first process leaves behind ends with it (as a run's does),
	// so nothing holds the pipes or the terminal open.
	s.killTree()
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	// A live reader that holds the pumps back gets 30 s to catch up (what
	// is left is at most a pipe's buffer); then the pumps go on regardless.
	clean := true
	select {
	case <-drained:
	case <-time.After(30 * time.Second):
		clean = false
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
	if err != nil {
		return 1, false
	}
	if reuse && clean {
		// The connections' writers send the exit and close on their own;
		// a connection coming after the listener closes is refused, and
		// the agent reads exit.json, written above.
		s.release(ln, pumps)
		return 0, true
	}
	time.Sleep(200 * time.Millisecond) // let connected agents read the exit
	return 0, false
}

// release lets go of an ended job (its pumps have drained, its exit is
// recorded): the control listener, the deadline, the stdin queue, the
// rings, the terminal and the output pipes. What is left of the job is its
// records on disk; a spare's next job starts from a new staging.
func (s *shim) release(ln net.Listener, pumps []io.Reader) {
	ln.Close() // serve returns; the socket file stays (the agent's reconnect is refused)
	if s.deadline != nil {
		s.deadline.Stop()
	}
	s.in.mu.Lock()
	s.in.done = true
	s.in.cond.Broadcast()
	s.in.mu.Unlock()
	for _, r := range s.rings {
		r.f.Close()
	}
	for _, r := range pumps {
		if f, ok := r.(*os.File); ok && f != s.pty {
			f.Close()
		}
	}
	if s.pty != nil {
		s.pty.Close() // stdinLoop's writes to it fail from here on
	}
}

// Sizes on the output path: each output pipe holds up to pipeBytes (the
// kernel's default, 64 KiB, made a process writing fast wait for the shim
// at every 64 KiB); the shim reads up to readBytes at once (and never more
// than the ring can keep past the slowest live reader).
const (
	pipeBytes = 1 << 20
	readBytes = 256 << 10
)

// pump copies one output stream into its ring (a terminal's into stdout).
// A pipe's bytes are spliced into the ring file (one copy, in the kernel);
// a terminal's, or a pipe's once splice has failed (said in the shim's
// log), are read and written.
func (s *shim) pump(i int, r io.Reader) {
	w := s.rings[i]
	max := min(readBytes, w.cap)
	pipe, splice := r.(*os.File)
	splice = splice && s.pty == nil
	var buf []byte
	for {
		s.mu.Lock()
		room := s.space(i, max)
		for room == 0 {
			s.room.Wait()
			room = s.space(i, max)
		}
		pos := w.end % w.cap // w.end moves only here
		s.mu.Unlock()
		var n int
		var err, werr error
		if splice {
			// The room is asked again before each splice (the pipe may
			// have been empty for long, and a hold come meanwhile), and
			// the limit raised to what this splice may move (ring.go).
			n, err = spliceToFile(pipe, w.f, int64(pos), int(min(room, w.cap-pos)), func(k uint64) uint64 {
				if k > 0 {
					s.mu.Lock()
					k = s.space(i, k)
					s.mu.Unlock()
				}
				w.intend(k)
				return k
			})
			if err != nil && err != io.EOF && n == 0 {
				fmt.Fprintf(os.Stderr, "shim: ring %d: splice: %v; reading and writing instead\n", i, err)
				splice = false
				continue
			}
		} else {
			if buf == nil {
				buf = make([]byte, max)
			}
			n, err = r.Read(buf[:room])
		}
		if n > 0 {
			s.mu.Lock()
			if splice {
				w.wrote(uint64(n))
			} else {
				werr = w.write(buf[:n])
			}
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
			// (a splice that moved nothing, held back by a hold that came
			// while it waited for the pipe, returns no error: the room is
			// waited for again)
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

// stdinLoop writes the queued stdin to the process, in order, until the
// job is released and the queue empty.
func (s *shim) stdinLoop() {
	for {
		s.in.mu.Lock()
		for len(s.in.q) == 0 {
			if s.in.done {
				s.in.mu.Unlock()
				if s.stdin != nil && s.pty == nil {
					s.stdin.Close()
				}
				return
			}
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

// space says how many bytes (at most max) ring i can take without
// overwriting bytes a live reader has not read yet; s.mu held.
func (s *shim) space(i int, max uint64) uint64 {
	if s.ended {
		return max
	}
	r := s.rings[i]
	for _, h := range s.holds {
		if r.end >= h[i]+r.cap {
			return 0
		}
		max = min(max, h[i]+r.cap-r.end)
	}
	return max
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
