package procs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// closeOnExecFrom marks every descriptor from fd up close-on-exec.
func closeOnExecFrom(fd int) {
	if unix.CloseRange(uint(fd), ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	ents, _ := os.ReadDir("/proc/self/fd") // before Linux 5.11
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n >= fd {
			unix.CloseOnExec(n)
		}
	}
}

// growPipe sets the pipe f's capacity to n bytes (best effort: the default
// 64 KiB works, only slower).
func growPipe(f *os.File, n int) {
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, n) })
	}
}

// dupTo makes fd to a copy of fd old (not close-on-exec).
func dupTo(old, to int) error { return unix.Dup3(old, to, 0) }

// seqpacketPair is a close-on-exec AF_UNIX SOCK_SEQPACKET socket pair.
func seqpacketPair() ([2]int, error) {
	return unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
}

// spliceToFile moves up to n bytes from the pipe r into f at offset off
// with splice(2): the pipe's pages are copied into f's page cache once,
// never through the caller's memory. It waits (on the runtime's poller)
// until the pipe holds data or its writers are gone (0, io.EOF). Before
// each splice, intend(n) says how many bytes it may move now (0: none, and
// spliceToFile returns 0, nil); after one that moved nothing, intend(0)
// (the ring's write limit, ring.go).
func spliceToFile(r *os.File, f *os.File, off int64, n int, intend func(uint64) uint64) (int, error) {
	rc, err := r.SyscallConn()
	if err != nil {
		return 0, err
	}
	wc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var moved int
	var serr error
	held := false
	cerr := wc.Control(func(wfd uintptr) {
		err = rc.Read(func(fd uintptr) bool {
			for {
				var m int64
				k := intend(uint64(n))
				if k == 0 {
					held = true
					return true
				}
				m, serr = unix.Splice(int(fd), nil, int(wfd), &off, int(k), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
				if m <= 0 {
					intend(0)
				}
				moved = int(m)
				if serr != unix.EINTR {
					return serr != unix.EAGAIN
				}
			}
		})
	})
	switch {
	case cerr != nil:
		return 0, cerr
	case err != nil:
		return 0, err
	case serr != nil:
		return 0, serr
	case held:
		return 0, nil
	case moved == 0:
		return 0, io.EOF
	}
	return moved, nil
}

// awaitExit returns once the process pid (a child of the caller, not yet
// reaped) has ended, waiting on the runtime's poller (a pidfd is readable
// once its process has ended), so that Wait then reaps it without
// blocking. A shim runs with one P (shimEnv): a Wait that blocks in
// waitid holds it, and the pumps, woken by the poller when the process
// writes, wait for the runtime's monitor to take it back, up to 10 ms
// later (bench/README.md, issue 20). Best effort: where no pidfd can be
// had, it returns at once and Wait blocks as before.
func awaitExit(pid int) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd") // non-blocking: on the poller
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Read(func(fd uintptr) bool {
		var info unix.Siginfo
		// WNOWAIT: it only looks (Wait reaps). Still running: EAGAIN (a
		// non-blocking pidfd), or no error and no signal in info.
		err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		return err != unix.EAGAIN && (err != nil || info.Signo != 0)
	})
}

// taskStates says where the process pid and its children stand, for an
// error that says why a start did not come: each task's name, state, the kernel
// function it waits in and its stack's first frames (/proc/PID/task/TID/
// comm, stat, wchan and stack), at most 16 tasks.
func taskStates(pid int) string {
	var b strings.Builder
	n := 0
	var walk func(pid, depth int)
	walk = func(pid, depth int) {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, t := range tasks {
			if n == 16 {
				return
			}
			n++
			dir := fmt.Sprintf("/proc/%d/task/%s", pid, t.Name())
			stat, _ := os.ReadFile(dir + "/stat")
			state := "?"
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
				state = string(stat[i+2])
			}
			wchan, _ := os.ReadFile(dir + "/wchan")
			comm, _ := os.ReadFile(dir + "/comm")
			if b.Len() > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%d/%s %s %s %s", pid, t.Name(), strings.TrimSpace(string(comm)), state, strings.TrimSpace(string(wchan)))
			// The kernel stack's first frames (root only), innermost first.
			stack, _ := os.ReadFile(dir + "/stack")
			var frames []string
			for _, l := range strings.Split(string(stack), "\n") {
				if f := strings.Fields(l); len(f) == 2 && len(frames) < 6 {
					frames = append(frames, strings.SplitN(f[1], "+", 2)[0])
				}
			}
			if len(frames) > 0 {
				fmt.Fprintf(&b, " [%s]", strings.Join(frames, " < "))
			}
			if depth < 2 {
				kids, _ := os.ReadFile(dir + "/children")
				for _, k := range strings.Fields(string(kids)) {
					if c, err := strconv.Atoi(k); err == nil {
						walk(c, depth+1)
					}
				}
			}
		}
	}
	walk(pid, 0)
	if b.Len() == 0 {
		return "gone"
	}
	return b.String()
}
