package store

import (
	"runtime"
	"syscall"
)

// backgroundNice is the fold thread's nice value: the lowest priority
// short of SCHED_IDLE (which a busy host could starve for good), as
// database engines run their compactions.
const backgroundNice = 19

// backgroundThread runs f on a thread of its own at nice backgroundNice,
// locked to the calling goroutine for the rest of its life: the goroutine
// must return soon after (it never unlocks the thread), so the runtime
// ends that thread with it, and no other goroutine ever runs at that
// priority. Lowering a thread's own priority needs no privilege; if the
// kernel refuses anyway f runs at the agent's priority, as before.
//
// The main thread is never that thread: the runtime does not end it but
// parks it for good (mexit), and the kernel gives it a process's signals
// first. A goroutine that finds itself locked there keeps it, blocked,
// while another thread runs f (no other goroutine can run on a thread
// locked to one), and then hands it back at its own priority.
func backgroundThread(f func()) {
	runtime.LockOSThread()
	if syscall.Gettid() == syscall.Getpid() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			backgroundThread(f)
		}()
		<-done
		runtime.UnlockOSThread()
		return
	}
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), backgroundNice)
	f()
}
