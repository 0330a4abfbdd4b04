// Package throwaway runs work on an OS thread that ends with it: the
// thread may join a session's namespaces or take its credentials, and
// nothing else of the process ever runs on it.
package throwaway

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs fn on a locked OS thread that is never unlocked, so Go ends
// the thread when fn returns, and returns fn's error. fn may change what
// is per thread (unshare(CLONE_FS), setns, setfsuid, capset, ...).
//
// It is never the process's main thread: Go does not end that thread when
// a goroutine locked to it returns, it parks it for the process's life
// ("wedged"), and the main thread is what other code reads as the process
// (/proc/self/status, /proc/self/mountinfo, /proc/self/ns/*, and every
// all-threads credential call, which aborts the process when one thread
// refuses it). When the new goroutine lands on the main thread, it keeps
// that thread locked, untouched, while fn runs on another (no goroutine
// runs on a thread locked to another), then gives it back.
func Run(fn func() error) error {
	errc := make(chan error, 1)
	go run(fn, errc)
	return <-errc
}

func run(fn func() error, errc chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		defer runtime.UnlockOSThread()
		errc <- Run(fn)
		return
	}
	errc <- fn()
}
