//go:build linux

package probe

import (
	"errors"
	"net/netip"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// udpLoop is what loopudp saw: CLOCK_MONOTONIC ns of the denied connect's
// return and start and of the connect before it (allowed), the longest
// iteration of the loop, the thread's context switches
// during it (getrusage RUSAGE_THREAD), so that a late denial can be told
// apart: a slow denied connect (the kernel path, or an interrupt inside
// it) from a late start (the loop descheduled or interrupted before it).
//
// And the same figure with nothing revoked, as a control: ctl is an
// instant ctlAfter into the loop (chosen by the loop's clock, between two
// connects) and ctlEnd the return of the first connect that ends after it,
// so ctlEnd - ctl is what the revoke's figure would be for a stamp at ctl
// if the connect in progress had been denied: the stalls an idle kernel
// path meets on this CPU (ctlEnd 0: no control, the loop having ended
// before ctl or with the denied connect as the first to end after it).
type udpLoop struct {
	denied, start, prev, longest, nivcsw, unrun, loop, prevStart int64
	ctl, ctlEnd                                                  int64
}

// ctlAfter is how far into loopUDP's loop its control instant lies (ns):
// near the revoke, which the bench makes about 2 ms after it starts the
// loop, and rarely after it.
const ctlAfter = 1_500_000

// threadCPU is CLOCK_THREAD_CPUTIME_ID in ns: the calling thread's run time,
// which excludes time a hypervisor took the CPU away (paravirt steal).
func threadCPU() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// rawSockaddr is ap as the kernel's sockaddr_in or sockaddr_in6.
func rawSockaddr(ap netip.AddrPort) (unsafe.Pointer, uintptr, int) {
	port := ap.Port()
	if ap.Addr().Is4() {
		sa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		return unsafe.Pointer(sa), unsafe.Sizeof(*sa), unix.AF_INET
	}
	sa := &unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ap.Addr().As16()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	return unsafe.Pointer(sa), unsafe.Sizeof(*sa), unix.AF_INET6
}

// loopUDP's connects are raw system calls (RawSyscall: the Go scheduler is
// not told), so that the runtime's monitor never takes this locked
// thread's P during one: the thread would then sleep on a futex in
// exitsyscall until the P came back (runtime.stoplockedm, seen with perf
// in 15 % of loops), time the figure would charge to the revoke. And the
// loop begins with a trip through the scheduler (Gosched), which starts the
// runtime's 10 ms count of a goroutine running without a reschedule afresh:
// commands read from a blocking pipe never reschedule, so without it the
// loop is preempted (and its locked thread sleeps) as soon as it starts.
func loopUDP(addr string) (udpLoop, error) {
	var l udpLoop
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return l, err
	}
	sa, salen, fam := rawSockaddr(ap)
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return l, err
	}
	defer unix.Close(fd)
	runtime.Gosched()
	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru0)
	deadline := time.Now().Add(10 * time.Second)
	cpu0 := threadCPU()
	prev := Monotonic()
	wall0, prevStart := prev, prev
	l.ctl = wall0 + ctlAfter
	for i := 0; ; i++ {
		start := Monotonic()
		_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(sa), salen)
		end := Monotonic()
		var err error
		if e != 0 {
			err = e
		}
		if l.ctlEnd == 0 && end > l.ctl {
			l.ctlEnd = end
		}
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
			if l.ctlEnd == end {
				l.ctlEnd = 0 // the denial is the control's connect: no control
			}
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
