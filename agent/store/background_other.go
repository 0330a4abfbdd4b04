//go:build !linux

package store

// backgroundThread leaves the fold at the agent's priority off Linux,
// where setpriority's PRIO_PROCESS names the whole process, not a thread.
func backgroundThread() {}
