package dataplane

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

// Flow marks (bpf/flowmark.bpf.h): the kernel marks each handle a flow
// check tried a rule under (shk_handle_flows[slot] = its generation), and
// a revoke reads the mark in the same program that exchanges the state
// word (shk_revoke). Sweep mode then skips the walk of every socket of the
// host for a revoke whose handle nothing could be open under: a grant
// revoked before its first use, which is most of what an operator or an
// expiring session revokes. A revoke whose handle is marked sweeps, with
// its follow-ups, as before. A handle's deadline is the same: its sweep
// reads the mark first (mayHaveFlows).

// marksOrdered says whether this host's BPF JIT runs the marks' exchanges
// fully ordered, as the skip needs (bpf/flowmark.bpf.h): the x86-64 and
// arm64 JITs do; the powerpc and RISC-V ones only since Linux 6.10, so on
// any other architecture every revoke sweeps, as before the marks.
func marksOrdered() bool { return runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" }

// revokeWord exchanges ref's state word for revoked in the kernel and
// says whether a flow check tried a rule under ref or a descendant; d.mu
// held, ref checked live and not revoked (readHandle).
func (d *Dataplane) revokeWord(ref HandleRef) (flows bool, _ error) {
	a := shkShkRevokeArgs{Slot: ref.Slot, Generation: ref.Generation}
	rc, err := d.objs.ShkRevoke.Run(&ebpf.RunOptions{Context: a, ContextOut: &a})
	if err != nil {
		return false, fmt.Errorf("revoke %s: %w", ref, err)
	}
	if rc != 0 {
		return false, fmt.Errorf("revoke %s: the kernel's revoke returned %d (slot missing, or at another generation)", ref, int32(rc))
	}
	return a.Flows != 0, nil
}

// markAdoptedHandles marks the handles issued (not free) as ones a flow may
// be open under: an agent that kept no marks (an older version) left
// handles whose flows nothing marked. reconcileHandles runs it at Open when
// the marks map is new beside adopted handles (flowsOld); their first
// revoke each sweeps, as before.
func (d *Dataplane) markAdoptedHandles(issued []HandleRef) error {
	for _, h := range issued {
		if err := d.objs.ShkHandleFlows.Update(h.Slot, h.Generation, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("mark adopted handle %s: %w", h, err)
		}
	}
	return nil
}

// mayHaveFlows says whether a flow may be open under ref, read once its
// deadline has passed (the sweep the deadline arranges, watchDeadline):
// whether a flow check tried a rule under ref or a descendant. A check
// marks before it reads the handle's state and the clock, with a full
// barrier between (bpf/flowmark.bpf.h), and every check after the deadline
// refuses: a flow admitted under ref was admitted by a check that read the
// clock before the deadline, whose mark is visible by then (the timer fires
// a millisecond after it). Where the mark cannot say (a JIT that does not
// order the exchanges, a slot freed and issued again, a failed read), a
// flow may be open.
func (d *Dataplane) mayHaveFlows(ref HandleRef) bool {
	if !marksOrdered() {
		return true
	}
	var h shkShkHandle
	if err := d.objs.ShkHandles.Lookup(ref.Slot, &h); err != nil || h.Generation != ref.Generation {
		return true
	}
	var mark uint32
	if err := d.objs.ShkHandleFlows.Lookup(ref.Slot, &mark); err != nil {
		return true
	}
	return mark == ref.Generation
}
