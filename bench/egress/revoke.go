//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"runtime"
	"sort"
	"time"
	"unsafe"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"github.com/shinken-agent/shinken/bench/internal/connrounds"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/probe"
	"golang.org/x/sys/unix"
)

// The revoke latency: from the map write to the first denied connect.

// revokeLatency: a worker spins on UDP connect to an allowed destination; the
// bench revokes the handle and takes CLOCK_MONOTONIC as the map write returns; the
// worker reports CLOCK_MONOTONIC of its first EPERM. floor is the same figure
// with nothing revoked (the figure's A/A): in each loop, from a control
// instant 1.5 ms in to the return of the first connect that ends after it.
// Where a stall (a tick, an interrupt, the hypervisor taking the vCPU away)
// meets a connect as often as a revoke's denial meets one, the floor's p99
// is the figure's: the machine's, not the denial path's.
func (b *bench) revokeLatency() (lat, whole, floor []float64, parts []revokeSample, err error) {
	s, err := b.dp.CreateSession("revoke", dataplane.Limits{})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	w, err := b.worker(s)
	if err != nil {
		return nil, nil, nil, nil, err
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
	redone := 0
	for i := 0; i < *flagRevokes; i++ {
		h, err := b.dp.NewHandle(dataplane.HandleRef{}, time.Time{})
		if err != nil {
			return nil, nil, nil, nil, err
		}
		rule := dataplane.EgressRule{Prefix: netip.PrefixFrom(dst.Addr(), 32), Proto: dataplane.ProtoUDP, Handle: h}
		if err := b.dp.AllowEgress("revoke", rule); err != nil {
			return nil, nil, nil, nil, err
		}
		if !prev.Handle.IsZero() {
			b.dp.RemoveEgress("revoke", prev)
			b.dp.FreeHandle(prev.Handle)
		}
		prev = rule
		if err := w.Send("loopudp " + dst.String()); err != nil {
			return nil, nil, nil, nil, err
		}
		time.Sleep(2 * time.Millisecond) // let the loop spin
		var t0 int64
		start := time.Now()
		tw := probe.Monotonic()
		if err := b.dp.RevokeThen(h, func() { t0 = probe.Monotonic() }); err != nil {
			return nil, nil, nil, nil, err
		}
		whole = append(whole, float64(time.Since(start).Nanoseconds())/1e3)
		line, err := w.Recv()
		if err != nil {
			return nil, nil, nil, nil, err
		}
		var t1, cstart, prevEnd, longest, nivcsw, unrun, loop, prevStart, ctl, ctlEnd int64
		if _, err := fmt.Sscanf(line, "ok %d %d %d %d %d %d %d %d %d %d", &t1, &cstart, &prevEnd, &longest, &nivcsw, &unrun, &loop, &prevStart, &ctl, &ctlEnd); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("loopudp: %s", line)
		}
		if loop >= tw {
			// The worker's loop had not begun when the revoke started
			// (its process was not yet scheduled after the command):
			// its first connect was denied, and what this revoke would
			// time is the worker's wake-up, not the denial. Again.
			redone++
			if redone > *flagRevokes {
				return nil, nil, nil, nil, fmt.Errorf("revoke latency: the worker's loop began after the revoke %d times", redone)
			}
			i--
			continue
		}
		us := float64(t1-t0) / 1e3
		if us < 0 {
			us = 0 // denied before the map write's return was stamped
		}
		lat = append(lat, us)
		if ctlEnd > 0 && ctl < tw { // a control before the revoke began
			floor = append(floor, float64(ctlEnd-ctl)/1e3)
		}
		parts = append(parts, revokeSample{
			lat: us, write: float64(t0-tw) / 1e3, denied: float64(t1-cstart) / 1e3,
			gap: float64(cstart-prevEnd) / 1e3, late: float64(cstart-t0) / 1e3,
			allowed: float64(prevEnd-prevStart) / 1e3, longest: float64(longest) / 1e3, unrun: float64(unrun) / 1e3, nivcsw: nivcsw,
		})
	}
	if redone > 0 {
		fmt.Printf("revoke latency: %d revokes redone because the worker's loop had not begun when the revoke started\n", redone)
	}
	return lat, whole, floor, parts, nil
}

// revokeSample is one revoke's timeline (µs): lat, the figure (the first
// denial's return after the map write's return was stamped); write, from
// just before the revoke call to that stamp (the map write happened
// somewhere inside); denied, the denied connect's own duration; allowed,
// the allowed connect's before it; gap, from
// the previous (allowed) connect's return to the denied one's start (the
// worker's user-space step between two syscalls); late, from the stamp to
// the denied connect's start (negative: it began before the stamp); the
// longest iteration of the worker's loop; unrun, the loop's wall time less
// the worker thread's CPU time (CLOCK_THREAD_CPUTIME_ID, which leaves out
// what the hypervisor steals: with no context switch, that is the time the
// vCPU was taken away); and the worker's context switches during the loop
// (involuntary * 1000 + voluntary).
type revokeSample struct {
	lat, write, denied, allowed, gap, late, longest, unrun float64
	nivcsw                                                 int64
}

// printRevokeTail says where the time of the slowest revokes went, beside
// the same for all of them: is the tail the kernel's denial path (the
// denied connect itself slow), or the worker not running (a late start, a
// long gap, a context switch)?
func printRevokeTail(parts []revokeSample) {
	if len(parts) == 0 {
		return
	}
	sorted := append([]revokeSample(nil), parts...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].lat < sorted[j].lat })
	med := func(xs []revokeSample, f func(revokeSample) float64) float64 {
		v := make([]float64, len(xs))
		for i, x := range xs {
			v[i] = f(x)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	line := func(name string, xs []revokeSample) {
		var sw int
		for _, x := range xs {
			if x.nivcsw > 0 {
				sw++
			}
		}
		fmt.Printf("  %s (%d): latency median %.1fus; the denied connect itself %.1fus (the allowed one before it %.1fus); its start after the stamp %.1fus; gap after the allowed connect before it %.2fus; longest loop step %.1fus; loop time the worker did not run %.1fus; revoke call to stamp %.1fus; worker switched out in %d\n",
			name, len(xs), med(xs, func(r revokeSample) float64 { return r.lat }), med(xs, func(r revokeSample) float64 { return r.denied }),
			med(xs, func(r revokeSample) float64 { return r.allowed }),
			med(xs, func(r revokeSample) float64 { return r.late }), med(xs, func(r revokeSample) float64 { return r.gap }),
			med(xs, func(r revokeSample) float64 { return r.longest }), med(xs, func(r revokeSample) float64 { return r.unrun }),
			med(xs, func(r revokeSample) float64 { return r.write }), sw)
	}
	fmt.Printf("revoke -> first denied connect, where the time went (medians):\n")
	line("all revokes", sorted)
	tail := sorted[len(sorted)*99/100:]
	line("slowest 1%", tail)
	var stolen, switched, ran int
	var clean []float64
	for _, x := range sorted {
		if x.nivcsw == 0 && x.unrun < 1 {
			clean = append(clean, x.lat)
		}
	}
	for _, x := range tail {
		switch {
		case x.nivcsw > 0:
			switched++
		case x.unrun >= x.lat/2:
			stolen++
		default:
			ran++
		}
	}
	var vol, invol int
	for _, x := range sorted {
		if x.nivcsw%1000 > 0 {
			vol++
		}
		if x.nivcsw >= 1000 {
			invol++
		}
	}
	fmt.Printf("  worker loops with a voluntary switch (it slept: a lock) %d, with an involuntary one (preempted) %d\n", vol, invol)
	fmt.Printf("  slowest 1%%: %d with the worker switched out, %d with the worker's vCPU taken away for at least half the latency (no switch; the loop's wall time minus its CPU time), %d with the worker running throughout\n",
		switched, stolen, ran)
	if len(clean) > 0 {
		fmt.Printf("  revokes whose worker ran throughout its loop (no switch, under 1us not run): %d, p50 %.1fus p99 %.1fus (a diagnostic, not the figure)\n",
			len(clean), connrounds.Pct(clean, 50), connrounds.Pct(clean, 99))
	}
	for _, x := range tail {
		fmt.Printf("    %.1fus: denied connect %.1fus, started %.1fus after the stamp, gap %.2fus, longest step %.1fus, not run %.1fus, switches %d\n",
			x.lat, x.denied, x.late, x.gap, x.longest, x.unrun, x.nivcsw)
	}
}
