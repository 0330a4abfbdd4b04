package procs

import (
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
