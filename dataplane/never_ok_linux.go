package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// Admin-named exceptions to the never-list (shk_never_oks) are keyed by
// session and destination, and hold one handle: the kernel checks (and, for
// an approve-once handle, consumes) that one. Two grants of a session may
// name the same destination, so d.neverRefs keeps every handle whose NeverOK
// rule names each key: the entry goes when the last of them goes, and it
// always points at the best of those still standing (live before
// approve-once before spent), so revoking one grant never takes the
// exception from another.

// addNeverOK records that h names k and writes the entry; d.mu held.
func (d *Dataplane) addNeverOK(k shkShkNeverOkKey, h HandleRef) error {
	if !slices.Contains(d.neverRefs[k], h) {
		d.neverRefs[k] = append(d.neverRefs[k], h)
	}
	return d.writeNeverOK(k)
}

// dropNeverOK forgets that h names k: the entry goes with the last handle,
// or is pointed at another; d.mu held.
func (d *Dataplane) dropNeverOK(k shkShkNeverOkKey, h HandleRef) error {
	refs := slices.DeleteFunc(d.neverRefs[k], func(r HandleRef) bool { return r == h })
	if len(refs) > 0 {
		d.neverRefs[k] = refs
		return d.writeNeverOK(k)
	}
	delete(d.neverRefs, k)
	if err := d.objs.ShkNeverOks.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// repointNeverOKs rewrites the entries whose handle died while another
// handle naming them stands (after a revoke); d.mu held.
func (d *Dataplane) repointNeverOKs() error {
	var errs []error
	for k, refs := range d.neverRefs {
		if len(refs) > 1 {
			errs = append(errs, d.writeNeverOK(k))
		}
	}
	return errors.Join(errs...)
}

// writeNeverOK points k's entry at the best handle naming it; d.mu held.
func (d *Dataplane) writeNeverOK(k shkShkNeverOkKey) error {
	refs := d.neverRefs[k]
	if len(refs) == 0 {
		return nil
	}
	best, rank := refs[len(refs)-1], -1
	for _, r := range refs {
		if n := d.neverRank(r); n > rank {
			best, rank = r, n
		}
	}
	v := shkShkNeverOk{Handle: best.Slot, Generation: best.Generation}
	var cur shkShkNeverOk
	if err := d.objs.ShkNeverOks.Lookup(k, &cur); err == nil && cur == v {
		return nil
	}
	if err := d.objs.ShkNeverOks.Update(k, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write %v: %w", v, err)
	}
	return nil
}

// neverRank orders the handles an exception may point at: a live handle
// (3) before an approve-once one not used yet (2) before a spent one (1)
// before a dead one (0); d.mu held.
func (d *Dataplane) neverRank(r HandleRef) int {
	h, err := d.readHandle(r)
	if err != nil {
		return 0
	}
	if dead, err := d.ancestorRevoked(h); err != nil || dead {
		return 0
	}
	switch HandleState(h.State) {
	case HandleLive:
		return 3
	case HandleOnce:
		return 2
	case HandleUsed:
		return 1
	}
	return 0
}

// indexNeverOKs rebuilds d.neverRefs from an adopted egress entry's NeverOK
// rules.
func (d *Dataplane) indexNeverOKs(session uint32, p netip.Prefix, v *shkShkEgressValue) {
	for i := uint32(0); i < v.Nrules && i < MaxRules; i++ {
		r := v.Rules[i]
		if r.Flags&ruleNeverOK == 0 {
			continue
		}
		k := neverOKKey(session, EgressRule{Prefix: p, Ports: PortRange{Lo: r.PortLo, Hi: r.PortHi}})
		h := HandleRef{Slot: r.Handle, Generation: r.Generation}
		if !slices.Contains(d.neverRefs[k], h) {
			d.neverRefs[k] = append(d.neverRefs[k], h)
		}
	}
}
