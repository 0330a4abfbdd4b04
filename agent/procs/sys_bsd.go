//go:build unix && !linux

package procs

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// closeOnExecFrom marks descriptors from fd up (to 4096) close-on-exec.
func closeOnExecFrom(fd int) {
	for n := fd; n < 4096; n++ {
		unix.CloseOnExec(n)
	}
}

// growPipe: BSD pipes size themselves.
func growPipe(*os.File, int) {}

// spliceToFile: no splice(2) here; the pump reads and writes.
func spliceToFile(*os.File, *os.File, int64, int, func(uint64) uint64) (int, error) {
	return 0, errors.ErrUnsupported
}

// dupTo makes fd to a copy of fd old (not close-on-exec).
func dupTo(old, to int) error { return unix.Dup2(old, to) }

// seqpacketPair is a close-on-exec AF_UNIX SOCK_SEQPACKET socket pair
// (under ForkLock, as the standard library makes its descriptors).
func seqpacketPair() ([2]int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err == nil {
		unix.CloseOnExec(fds[0])
		unix.CloseOnExec(fds[1])
	}
	return fds, err
}

// awaitExit: Wait blocks (no pidfd here).
func awaitExit(int) {}

// taskStates is Linux only.
func taskStates(int) string { return "not read off Linux" }
