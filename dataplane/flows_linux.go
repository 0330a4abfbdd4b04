package dataplane

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
)

// kernelHasSockDestroy reports whether the running kernel exports the
// bpf_sock_destroy kfunc (Linux 6.5+), which sweep mode needs.
func kernelHasSockDestroy() (bool, error) { return kernelHasKfunc("bpf_sock_destroy") }

// kernelHasKfunc reports whether the running kernel's BTF has the function
// name: what the loader resolves a program's kfunc (or its weak kfunc's
// address) against.
func kernelHasKfunc(name string) (bool, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false, fmt.Errorf("read kernel BTF: %w", err)
	}
	var fn *btf.Func
	err = spec.TypeByName(name, &fn)
	if errors.Is(err, btf.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// skbTaskInfo reports whether cgroup_skb programs may call the current-task
// helpers (pid, comm) on this kernel, so that packet denials can name the
// sending process.
func skbTaskInfo() bool {
	return features.HaveProgramHelper(ebpf.CGroupSKB, asm.FnGetCurrentPidTgid) == nil &&
		features.HaveProgramHelper(ebpf.CGroupSKB, asm.FnGetCurrentComm) == nil
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// resolveFlowMode turns the configured mode into the one this kernel runs,
// refusing a mode it cannot enforce.
func resolveFlowMode(want FlowMode) (FlowMode, error) {
	has, err := kernelHasSockDestroy()
	if err != nil {
		return 0, err
	}
	switch want {
	case FlowAuto:
		if has {
			return FlowSweep, nil
		}
		return FlowPacket, nil
	case FlowSweep:
		if !has {
			return 0, fmt.Errorf("%w: flow mode sweep needs the bpf_sock_destroy kfunc (Linux 6.5+); this kernel lacks it (use packet mode)", ErrNotSupported)
		}
		return FlowSweep, nil
	case FlowPacket:
		return FlowPacket, nil
	}
	return 0, fmt.Errorf("dataplane config: unknown flow mode %d", want)
}

// sweeper runs the socket iterators of sweep mode, and one goroutine that
// runs the follow-up sweeps of every revoke (followup.go).
type sweeper struct {
	mu       sync.Mutex // one sweep at a time
	tcp, udp *link.Iter
	closed   bool

	statMu    sync.Mutex // the counters, the follow-up schedule, the deadline timers
	sweeps    uint64
	skipped   uint64 // revokes that needed none (flowmark_linux.go)
	destroyed uint64
	errors    uint64
	lastErr   error
	follow    followSchedule
	timers    map[*time.Timer]struct{} // handle deadlines

	epoch     time.Time      // follow-up due times are offsets from it
	followUps *atomic.Uint64 // follow-up sweeps run (Ops.FollowUpSweeps)
	wake      chan struct{}  // the schedule gained a due time
	stop      chan struct{}  // closed by close: the goroutine ends
	done      chan struct{}  // closed when it has
}

func (d *Dataplane) startSweeper() error {
	tcp, err := link.AttachIter(link.IterOptions{Program: d.objs.ShkSweepTcp})
	if err != nil {
		return fmt.Errorf("attach TCP socket iterator: %w", err)
	}
	udp, err := link.AttachIter(link.IterOptions{Program: d.objs.ShkSweepUdp})
	if err != nil {
		tcp.Close()
		return fmt.Errorf("attach UDP socket iterator: %w", err)
	}
	d.sweep = &sweeper{
		tcp: tcp, udp: udp, timers: map[*time.Timer]struct{}{},
		follow: newFollowSchedule(followUpSweeps), epoch: time.Now(), followUps: &d.ops.followUpSweeps,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go d.sweep.followLoop()
	return nil
}

// close ends the follow-up goroutine (a sweep it is running finishes
// first), stops the deadline timers and closes the iterators.
func (s *sweeper) close() {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.statMu.Lock()
	for t := range s.timers {
		t.Stop()
	}
	s.statMu.Unlock()
	s.tcp.Close()
	s.udp.Close()
}

// run walks every TCP and UDP socket of the agent's network namespace once
// and destroys each session socket whose peer no live grant covers. It
// returns how many it destroyed. It serves the follow-ups due before it
// started.
func (s *sweeper) run() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, os.ErrClosed
	}
	start := time.Since(s.epoch)
	n := 0
	var errs []error
	for _, it := range []*link.Iter{s.tcp, s.udp} {
		r, err := it.Open()
		if err != nil {
			errs = append(errs, fmt.Errorf("open socket iterator: %w", err))
			continue
		}
		// The program writes one session index (4 bytes) per socket it destroyed.
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("run socket iterator: %w", err))
		}
		n += len(b) / 4
	}
	err := errors.Join(errs...)
	s.statMu.Lock()
	s.sweeps++
	s.destroyed += uint64(n)
	if err != nil {
		s.errors++
		s.lastErr = err
	}
	// A failed sweep serves the follow-ups too: the error is counted, and
	// trying again at once would only spin.
	s.follow.served(start)
	s.statMu.Unlock()
	return n, err
}

// followUp schedules the follow-up sweeps of a revoke that happened now.
func (s *sweeper) followUp() {
	s.statMu.Lock()
	s.follow.add(time.Since(s.epoch))
	s.statMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// nextFollowUp returns when the next follow-up sweep must start, if any.
func (s *sweeper) nextFollowUp() (time.Duration, bool) {
	s.statMu.Lock()
	defer s.statMu.Unlock()
	return s.follow.next()
}

// followLoop is the sweeper's goroutine, until close: it sleeps until some
// follow-up's window is about to close with no sweep run in it, then runs
// one sweep, which serves every follow-up whose window has opened.
func (s *sweeper) followLoop() {
	defer close(s.done)
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		var fire <-chan time.Time
		if next, ok := s.nextFollowUp(); ok {
			t.Reset(next - time.Since(s.epoch)) // fires at once if due
			fire = t.C
		}
		select {
		case <-s.stop:
			return
		case <-s.wake:
			continue
		case <-fire:
		}
		if next, ok := s.nextFollowUp(); !ok || next > time.Since(s.epoch) {
			continue // another sweep served them meanwhile
		}
		if _, err := s.run(); !errors.Is(err, os.ErrClosed) {
			s.followUps.Add(1) // its error, if any, is in the stats
		}
	}
}

// at sweeps once shortly after deadline (a handle's expiry), unless need,
// asked then, says no flow can be open under the handle (counted as
// skipped).
func (s *sweeper) at(deadline time.Time, need func() bool) {
	s.statMu.Lock()
	defer s.statMu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(time.Until(deadline)+time.Millisecond, func() {
		swept := need()
		if swept {
			s.run() //nolint:errcheck // recorded in the stats
		}
		s.statMu.Lock()
		if !swept {
			s.skipped++
		}
		delete(s.timers, t)
		s.statMu.Unlock()
	})
	s.timers[t] = struct{}{}
}

// FlowMode is how the dataplane cuts flows that are already open when the
// authority they were opened under dies.
func (d *Dataplane) FlowMode() FlowMode { return d.cfg.FlowMode }

// SweepStats reports the sweeper's counters.
func (d *Dataplane) SweepStats() SweepStats {
	if d.sweep == nil {
		return SweepStats{}
	}
	d.sweep.statMu.Lock()
	defer d.sweep.statMu.Unlock()
	return SweepStats{Sweeps: d.sweep.sweeps, Skipped: d.sweep.skipped, Destroyed: d.sweep.destroyed, Errors: d.sweep.errors, LastErr: d.sweep.lastErr}
}

// Sweep destroys, now, every open session socket whose peer no live grant
// covers any more, and returns how many. Revoke calls it; so do handle
// deadlines. In packet mode it does nothing (the kernel drops such flows'
// packets by itself).
func (d *Dataplane) Sweep() (int, error) {
	if d.sweep == nil {
		return 0, nil
	}
	return d.sweep.run()
}

// cutFlows runs after a revoke's map write: one sweep now (counted in
// Ops.Sweeps), and the revoke's follow-ups scheduled on the sweeper's
// goroutine (counted in Ops.FollowUpSweeps when they run).
func (d *Dataplane) cutFlows() error {
	if d.sweep == nil {
		return nil
	}
	_, err := d.sweep.run()
	d.ops.sweeps.Add(1)
	d.sweep.followUp()
	return err
}

// skipSweep counts a revoke that needed no sweep: no flow check ever
// tried a rule under its handle (flowmark_linux.go), so no socket can be
// open under it, and none of its follow-ups either.
func (d *Dataplane) skipSweep() {
	if d.sweep == nil {
		return
	}
	d.sweep.statMu.Lock()
	d.sweep.skipped++
	d.sweep.statMu.Unlock()
}

// watchDeadline arranges a sweep when handle ref expires (at expires),
// unless by then no flow check ever tried a rule under it or a descendant
// (flowmark_linux.go: mayHaveFlows).
func (d *Dataplane) watchDeadline(ref HandleRef, expires time.Time) {
	if d.sweep == nil || expires.IsZero() {
		return
	}
	d.sweep.at(expires, func() bool { return d.mayHaveFlows(ref) })
}

// removeObsoleteLinks unpins links this mode does not use (a pin left by an
// agent running the other mode, or an older version): the kernel detaches a
// link when its last reference goes.
func (d *Dataplane) removeObsoleteLinks(used map[string]bool) error {
	dir := filepath.Join(d.cfg.PinPath, "links")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if used[e.Name()] || fsLSMLinkPin(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		// Detach first: the kernel frees an unpinned link asynchronously,
		// so removing the pin alone can leave the program attached for a
		// moment after Open returns.
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				l.Close()
				return fmt.Errorf("detach obsolete link %s: %w", e.Name(), err)
			}
			l.Close()
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove obsolete link %s: %w", e.Name(), err)
		}
	}
	return nil
}
