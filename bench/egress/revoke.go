//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"runtime"
	"time"
	"unsafe"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/probe"
	"golang.org/x/sys/unix"
)

// The revoke latency: from the map write to the first denied connect.

// revokeLatency: a worker spins on UDP connect to an allowed destination; the
// bench revokes the handle and takes CLOCK_MONOTONIC as the map write returns; the
// worker reports CLOCK_MONOTONIC of its first EPERM.
func (b *bench) revokeLatency() (lat, whole []float64, err error) {
	s, err := b.dp.CreateSession("revoke", dataplane.Limits{})
	if err != nil {
		return nil, nil, err
	}
	w, err := b.worker(s)
	if err != nil {
		return nil, nil, err
	}
	// Worker spins on the last CPU, the revoking thread runs on the first,
	// both SCHED_FIFO so that other load on the machine does not preempt
	// them mid-measurement (the kernel's RT throttling still applies).
	fifo := func(pid int) {
		type schedParam struct{ prio int32 }
		p := schedParam{prio: 10}
		unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(pid), 1 /* SCHED_FIFO */, uintptr(unsafe.Pointer(&p)))
	}
	tid, _ := w.TID() // 0 (this thread) if it did not say
	fifo(tid)
	if n := benchkit.NumCPU(); n > 1 {
		w.Do(fmt.Sprintf("cpu %d", n-1))
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(0)
		unix.SchedSetaffinity(0, &set)
	}
	fifo(0)
	defer func() {
		type schedParam struct{ prio int32 }
		p := schedParam{}
		unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, 0, 0 /* SCHED_OTHER */, uintptr(unsafe.Pointer(&p)))
	}()
	dst := netip.MustParseAddrPort("127.0.0.2:9")
	var prev dataplane.EgressRule
	for i := 0; i < *flagRevokes; i++ {
		h, err := b.dp.NewHandle(dataplane.HandleRef{}, time.Time{})
		if err != nil {
			return nil, nil, err
		}
		rule := dataplane.EgressRule{Prefix: netip.PrefixFrom(dst.Addr(), 32), Proto: dataplane.ProtoUDP, Handle: h}
		if err := b.dp.AllowEgress("revoke", rule); err != nil {
			return nil, nil, err
		}
		if !prev.Handle.IsZero() {
			b.dp.RemoveEgress("revoke", prev)
			b.dp.FreeHandle(prev.Handle)
		}
		prev = rule
		if err := w.Send("loopudp " + dst.String()); err != nil {
			return nil, nil, err
		}
		time.Sleep(2 * time.Millisecond) // let the loop spin
		var t0 int64
		start := time.Now()
		if err := b.dp.RevokeThen(h, func() { t0 = probe.Monotonic() }); err != nil {
			return nil, nil, err
		}
		whole = append(whole, float64(time.Since(start).Nanoseconds())/1e3)
		line, err := w.Recv()
		if err != nil {
			return nil, nil, err
		}
		var t1 int64
		if _, err := fmt.Sscanf(line, "ok %d", &t1); err != nil {
			return nil, nil, fmt.Errorf("loopudp: %s", line)
		}
		us := float64(t1-t0) / 1e3
		if us < 0 {
			us = 0 // denied before the map write's return was stamped
		}
		lat = append(lat, us)
	}
	return lat, whole, nil
}
