//go:build linux

package benchkit

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// LoadAvg is the host's 1, 5 and 15 minute load average, or "?".
func LoadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// KernelRelease is the running kernel's release string.
func KernelRelease() string {
	data, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(data))
}

// MonoNS is CLOCK_MONOTONIC in nanoseconds: the same clock in every
// process of a run, so times taken in a worker and in the bench compare.
func MonoNS() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// NumCPU is the number of processors /proc/cpuinfo lists (all of the
// host's, whatever this process's affinity).
func NumCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "\nprocessor") + 1
}
