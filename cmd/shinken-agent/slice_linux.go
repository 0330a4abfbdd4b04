package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// The agent's CPU slice (issue 23, fair sharing). Every session's DNS
// answers, grants and process I/O go through the agent's threads, so a
// session that keeps the CPUs busy delays every other session by delaying
// the agent. Where the cpu controller is not on cgroup v2 (this project's
// hybrid hosts) nothing bounds a session's CPU share; but Linux 6.12+ lets
// a fair task ask for a shorter EEVDF slice (sched_attr.sched_runtime,
// clamped to 0.1–100 ms), which gives it an earlier deadline, so that on
// wakeup it preempts a task that has run a while instead of waiting out
// that task's slice. It is a latency setting, not a share: the agent gets
// no more CPU than before, it gets it sooner after it wakes.
//
// The slice is set on every thread of the agent with SCHED_FLAG_RESET_ON_FORK,
// so no process the agent starts (a shim, a holder, a launcher, and so
// nothing a session runs) inherits it; a thread the Go runtime creates
// later does not inherit it either (reset on fork covers clone), so keep
// sets it on new threads every second.

// defaultSliceUS is agent_cpu_slice_us's default: the kernel's minimum.
const defaultSliceUS = 100

type sliceKeeper struct {
	ns uint64

	mu      sync.Mutex
	threads int   // threads that have the slice
	err     error // why the slice is not set, if it is not
}

// newSliceKeeper sets the slice (µs; 0: defaultSliceUS; negative: none)
// on every thread now.
func newSliceKeeper(us int) *sliceKeeper {
	if us == 0 {
		us = defaultSliceUS
	}
	if us < 0 {
		return &sliceKeeper{err: errors.New("off (agent_cpu_slice_us -1)")}
	}
	k := &sliceKeeper{ns: uint64(us) * 1000}
	k.keep()
	return k
}

// keep sets the slice on every thread of the agent that lacks it.
func (k *sliceKeeper) keep() {
	if k.ns == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	n, err := setSliceAll(k.ns)
	k.threads, k.err = n, err
}

// fact is the status line: what the agent's threads run with, and why.
func (k *sliceKeeper) fact() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return "kernel default slice: " + k.err.Error()
	}
	return fmt.Sprintf("%g ms EEVDF slice on the agent's %d threads (sched_attr.sched_runtime, Linux 6.12+; reset on fork, so no session process has it): the resolver and the API preempt a busy session's tasks on wakeup; a latency setting, not a CPU share",
		float64(k.ns)/1e6, k.threads)
}

// setSliceAll gives every fair-class thread of this process the slice ns,
// keeping its policy and nice; it returns how many threads have it. A
// kernel that takes the call but not the slice (before 6.12, where a fair
// task's sched_runtime is ignored) is an error: nothing is claimed.
func setSliceAll(ns uint64) (int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ok, err := setSlice(tid, ns)
		if errors.Is(err, unix.ESRCH) {
			continue // the thread ended
		}
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// setSlice sets one thread's slice if it is in a fair class (normal or
// batch) and lacks it; true when the thread has it afterwards.
func setSlice(tid int, ns uint64) (bool, error) {
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return false, fmt.Errorf("sched_getattr %d: %w", tid, err)
	}
	if a.Policy != unix.SCHED_NORMAL && a.Policy != unix.SCHED_BATCH {
		return false, nil // real-time, deadline or idle: the operator chose; left alone
	}
	if a.Runtime == ns && a.Flags&unix.SCHED_FLAG_RESET_ON_FORK != 0 {
		return true, nil
	}
	a.Runtime, a.Flags = ns, unix.SCHED_FLAG_RESET_ON_FORK
	a.Size = unix.SizeofSchedAttr
	if err := unix.SchedSetAttr(tid, a, 0); err != nil {
		return false, fmt.Errorf("sched_setattr %d: %w", tid, err)
	}
	b, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return false, fmt.Errorf("sched_getattr %d: %w", tid, err)
	}
	if b.Runtime != ns {
		return false, fmt.Errorf("unavailable: the kernel took sched_setattr but keeps a slice of %d ns, not %d (a fair task's slice needs Linux 6.12+)", b.Runtime, ns)
	}
	return true, nil
}
