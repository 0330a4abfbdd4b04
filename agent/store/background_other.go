//go:build !linux

package store

// backgroundThread runs f at the agent's priority off Linux, where
// setpriority's PRIO_PROCESS names the whole process, not a thread.
func backgroundThread(f func()) { f() }
