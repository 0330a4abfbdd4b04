package dataplane

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

func requireSweepMode(t *testing.T) {
	t.Helper()
	kerneltest.RequireRoot(t)
	if flowModes(t)[0] != FlowSweep {
		t.Skip("this kernel lacks bpf_sock_destroy: no sweep mode, no follow-up sweeps")
	}
}

// TestRevokeBurstFollowUps: a burst of revokes runs one sweep per revoke
// (Ops.Sweeps) and shares its follow-up sweeps (Ops.FollowUpSweeps), which
// the sweeper's one goroutine runs: at most one per window less a grain of
// each step over the burst, however many revokes it held; nothing is left
// scheduled once they have run.
func TestRevokeBurstFollowUps(t *testing.T) {
	requireSweepMode(t)
	d := newDataplane(t, modeConfig(t, FlowSweep))
	const n = 40
	hs := make([]HandleRef, n)
	for i := range hs {
		hs[i] = flowedHandle(t, d)
	}
	sw := d.sweep
	before := d.Ops()
	first := time.Since(sw.epoch)
	for _, h := range hs {
		if err := d.Revoke(h); err != nil {
			t.Fatal(err)
		}
	}
	last := time.Since(sw.epoch)
	burst := d.Ops()
	if w, s := burst.RevokeWrites-before.RevokeWrites, burst.Sweeps-before.Sweeps; w != n || s != n {
		t.Fatalf("%d revokes: %d revoke writes and %d sweeps, want %d and %d", n, w, s, n, n)
	}
	// The goroutine sweeps when the window of a step's earliest start time
	// not served yet closes; its sweep serves that step up to then, so the
	// next one for the step comes a window less a grain later at least.
	bound := 0
	for _, st := range followUpSweeps {
		bound += int((last-first+st.grain())/(st.window-st.grain())) + 1
	}
	during := burst.FollowUpSweeps - before.FollowUpSweeps
	end := followUpSweeps[len(followUpSweeps)-1]
	time.Sleep(time.Until(sw.epoch.Add(last + end.after + end.window + 500*time.Millisecond)))
	got := d.Ops().FollowUpSweeps - before.FollowUpSweeps
	t.Logf("%d revokes in %v: %d follow-up sweeps (%d during the burst), at most %d allowed", n, last-first, got, during, bound)
	if got == 0 || got > uint64(bound) {
		t.Fatalf("%d revokes in %v ran %d follow-up sweeps, want 1 to %d", n, last-first, got, bound)
	}
	if next, ok := sw.nextFollowUp(); ok {
		t.Fatalf("a follow-up is still due at %v, %v after the burst", next, time.Since(sw.epoch)-last)
	}
	if st := d.SweepStats(); st.Errors != 0 {
		t.Fatalf("sweep stats %+v", st)
	}
}

// TestCloseStopsFollowUps: closing the dataplane ends the sweeper's
// goroutine before Close returns, though follow-ups were still due, and none
// runs afterwards.
func TestCloseStopsFollowUps(t *testing.T) {
	requireSweepMode(t)
	cfg := modeConfig(t, FlowSweep)
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Remove(cfg); err != nil {
			t.Errorf("remove dataplane: %v", err)
		}
	})
	h := flowedHandle(t, d)
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	sw := d.sweep
	if _, ok := sw.nextFollowUp(); !ok {
		t.Fatal("no follow-up scheduled after a revoke")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sw.done:
	default:
		t.Fatal("the follow-up goroutine still runs after Close returned")
	}
	sweeps := func() uint64 {
		sw.statMu.Lock()
		defer sw.statMu.Unlock()
		return sw.sweeps
	}
	n, f := sweeps(), d.Ops().FollowUpSweeps
	time.Sleep(followUpSweeps[len(followUpSweeps)-1].after + 300*time.Millisecond)
	if n2, f2 := sweeps(), d.Ops().FollowUpSweeps; n2 != n || f2 != f {
		t.Fatalf("after Close: %d sweeps and %d follow-ups ran", n2-n, f2-f)
	}
}

// flowedHandle issues a handle marked as if a flow check had tried a rule
// under it, so that its revoke sweeps (flowmark_linux.go).
func flowedHandle(t *testing.T, d *Dataplane) HandleRef {
	t.Helper()
	h := mustHandle(t, d, HandleRef{}, zeroTime)
	if err := d.objs.ShkHandleFlows.Update(h.Slot, h.Generation, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	return h
}
