//go:build linux

package benchkit

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ReadTrim is the content of a file (a /proc or /sys value) without its
// surrounding white space; "" if it cannot be read.
func ReadTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// CountProcs is the number of processes this process's PID namespace
// shows in /proc (-1 if /proc cannot be read).
func CountProcs() int {
	return countProcs(func(string) bool { return true })
}

// CountProcsOf is the number of those processes whose /proc entry
// belongs to uid (the process's effective uid); -1 if /proc cannot be read.
func CountProcsOf(uid uint32) int {
	return countProcs(func(pid string) bool {
		var st syscall.Stat_t
		return syscall.Stat("/proc/"+pid, &st) == nil && st.Uid == uid
	})
}

func countProcs(keep func(pid string) bool) int {
	f, err := os.Open("/proc")
	if err != nil {
		return -1
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	n := 0
	for _, s := range names {
		if _, err := strconv.Atoi(s); err == nil && keep(s) {
			n++
		}
	}
	return n
}

// MemInfoMiB is a field of /proc/meminfo ("MemAvailable:") in MiB; 0 if
// it is not there.
func MemInfoMiB(field string) float64 {
	for _, l := range strings.Split(ReadTrim("/proc/meminfo"), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// KernelMiB is the kernel's own memory that sessions grow: slab (mounts,
// superblocks, namespaces, tasks, cgroups), kernel stacks and page tables.
func KernelMiB() float64 {
	return MemInfoMiB("Slab:") + MemInfoMiB("KernelStack:") + MemInfoMiB("PageTables:")
}

// StatusKiB reads a "Name: N kB" (or count) field of /proc/PID/status
// ("VmRSS:", "Threads:"); 0 if it is not there.
func StatusKiB(pid int, field string) float64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// PssKiB is the proportional set size of process pid (from its
// smaps_rollup), and whether it could be read.
func PssKiB(pid string) (float64, bool) {
	for _, l := range strings.Split(ReadTrim("/proc/"+pid+"/smaps_rollup"), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v, true
		}
	}
	return 0, false
}
