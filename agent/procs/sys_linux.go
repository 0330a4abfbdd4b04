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
