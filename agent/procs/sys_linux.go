package procs

import (
	"io"
	"os"
	"strconv"

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
