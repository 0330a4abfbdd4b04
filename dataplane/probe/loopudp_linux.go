//go:build linux

package probe

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// udpLoop is what loopudp saw: CLOCK_MONOTONIC ns of the denied connect's
// return and start and of the connect before it (allowed), the longest
// iteration of the loop, the thread's context switches
// during it (getrusage RUSAGE_THREAD), so that a late denial can be told
// apart: a slow denied connect (the kernel path, or an interrupt inside
// it) from a late start (the loop descheduled or interrupted before it).
type udpLoop struct {
	denied, start, prev, longest, nivcsw, unrun, loop, prevStart int64
}

// threadCPU is CLOCK_THREAD_CPUTIME_ID in ns: the calling thread's run time,
// which excludes time a hypervisor took the CPU away (paravirt steal).
func threadCPU() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

func loopUDP(addr string) (udpLoop, error) {
	var l udpLoop
	sa, fam, err := sockaddr(addr, false)
	if err != nil {
		return l, err
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return l, err
	}
	defer unix.Close(fd)
	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru0)
	deadline := time.Now().Add(10 * time.Second)
	cpu0 := threadCPU()
	prev := Monotonic()
	wall0, prevStart := prev, prev
	for i := 0; ; i++ {
		start := Monotonic()
		err := unix.Connect(fd, sa)
		end := Monotonic()
		if d := end - prev; d > l.longest {
			l.longest = d
		}
		if errors.Is(err, unix.EPERM) {
			cpu1 := threadCPU()
			wall1 := Monotonic()
			_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru1)
			l.denied, l.start, l.prev = end, start, prev
			l.nivcsw = (ru1.Nivcsw-ru0.Nivcsw)*1000 + ru1.Nvcsw - ru0.Nvcsw
			l.unrun = (wall1 - wall0) - (cpu1 - cpu0)
			l.loop, l.prevStart = wall0, prevStart
			return l, nil
		}
		if err != nil {
			return l, err
		}
		prev, prevStart = end, start
		if i&1023 == 0 && time.Now().After(deadline) {
			return l, errors.New("no denial within 10s")
		}
	}
}
