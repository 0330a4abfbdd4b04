package store

import (
	"runtime"
	"syscall"
)

// backgroundNice is the fold thread's nice value: the lowest priority
// short of SCHED_IDLE (which a busy host could starve for good), as
// database engines run their compactions.
const backgroundNice = 19

// backgroundThread puts the calling goroutine on a thread of its own at
// nice backgroundNice, for the rest of the goroutine's life: the goroutine
// never unlocks it, so the runtime ends that thread when the goroutine
// returns, and no other goroutine ever runs at that priority. Lowering a
// thread's own priority needs no privilege; if the kernel refuses anyway
// the fold runs at the agent's priority, as before.
func backgroundThread() {
	runtime.LockOSThread()
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), backgroundNice)
}
