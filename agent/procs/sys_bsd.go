//go:build unix && !linux

package procs

import "golang.org/x/sys/unix"

// closeOnExecFrom marks descriptors from fd up (to 4096) close-on-exec.
func closeOnExecFrom(fd int) {
	for n := fd; n < 4096; n++ {
		unix.CloseOnExec(n)
	}
}
