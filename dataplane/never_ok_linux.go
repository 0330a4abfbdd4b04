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
// name the same destination, so d.neverRefs keeps every handle whose
// NeverOK rule names each key: the entry goes when the last of them goes,
// and it always points at the best of those still standing (live before
// approve-once before spent), so revoking one grant never takes the
// exception from another.
//
// Only a revoke can lower a handle's rank from user space's side (approve-once
// consumption happens in the kernel), and it lowers only the ranks of the
// revoked handle and its descendants. So d.never.handles indexes the keys
// each handle names, with the handle's chain (itself, then its ancestors,
// fixed when it was issued), and d.never.below lists, for each handle of such
// a chain, the indexed handles at or below it: a revoke re-points only the
// keys that d.never.below[ref]'s handles name.

// neverIndex indexes d.neverRefs by handle; d.mu guards it.
type neverIndex struct {
	handles map[HandleRef]*neverHandle // every handle of d.neverRefs
	below   map[HandleRef][]HandleRef  // the handles of handles at or below each handle
	evals   int                        // entries evaluated (writeNeverOK), for tests
}

func newNeverIndex() neverIndex {
	return neverIndex{handles: map[HandleRef]*neverHandle{}, below: map[HandleRef][]HandleRef{}}
}

// neverHandle is what d.never.handles keeps of a handle some NeverOK rule
// names.
type neverHandle struct {
	keys  []shkShkNeverOkKey // the exceptions it names
	chain []HandleRef        // itself, then its ancestors as far as they stand
}

// addNeverOK records that h names k and writes the entry; d.mu held.
func (d *Dataplane) addNeverOK(k shkShkNeverOkKey, h HandleRef) error {
	d.nameNeverOK(k, h)
	return d.writeNeverOK(k)
}

// nameNeverOK records that h names k; d.mu held.
func (d *Dataplane) nameNeverOK(k shkShkNeverOkKey, h HandleRef) {
	if slices.Contains(d.neverRefs[k], h) {
		return
	}
	d.neverRefs[k] = append(d.neverRefs[k], h)
	nh := d.never.handles[h]
	if nh == nil {
		nh = &neverHandle{chain: d.handleChain(h)}
		d.never.handles[h] = nh
		for _, a := range nh.chain {
			d.never.below[a] = append(d.never.below[a], h)
		}
	}
	nh.keys = append(nh.keys, k)
}

// unnameNeverOK forgets that h names k (not k's entry); d.mu held.
func (d *Dataplane) unnameNeverOK(k shkShkNeverOkKey, h HandleRef) {
	nh := d.never.handles[h]
	if nh == nil {
		return
	}
	nh.keys = slices.DeleteFunc(nh.keys, func(o shkShkNeverOkKey) bool { return o == k })
	if len(nh.keys) > 0 {
		return
	}
	delete(d.never.handles, h)
	for _, a := range nh.chain {
		below := slices.DeleteFunc(d.never.below[a], func(o HandleRef) bool { return o == h })
		if len(below) == 0 {
			delete(d.never.below, a)
		} else {
			d.never.below[a] = below
		}
	}
}

// handleChain is h, then its ancestors as far as they can be read (a handle
// whose chain is cut is dead already: no revoke can lower its rank); d.mu
// held.
func (d *Dataplane) handleChain(h HandleRef) []HandleRef {
	chain := []HandleRef{h}
	for r := h; len(chain) <= MaxChain; {
		v, err := d.readHandle(r)
		if err != nil || v.Parent == 0 {
			break
		}
		r = HandleRef{Slot: v.Parent, Generation: v.ParentGeneration}
		chain = append(chain, r)
	}
	return chain
}

// dropNeverOK forgets that h names k: the entry goes with the last handle,
// or is pointed at another; d.mu held.
func (d *Dataplane) dropNeverOK(k shkShkNeverOkKey, h HandleRef) error {
	d.unnameNeverOK(k, h)
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

// dropSessionNeverOKs removes the exceptions of the session with index
// session; d.mu held.
func (d *Dataplane) dropSessionNeverOKs(session uint32) error {
	var errs []error
	for k, refs := range d.neverRefs {
		if k.Session != session {
			continue
		}
		for _, h := range refs {
			d.unnameNeverOK(k, h)
		}
		delete(d.neverRefs, k)
		if err := d.objs.ShkNeverOks.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("never-list exception: %w", err))
		}
	}
	return errors.Join(errs...)
}

// repointNeverOKs rewrites, after ref's revoke, the entries that another
// handle still names and that ref or one of its descendants names (those
// whose best handle may have died); d.mu held.
func (d *Dataplane) repointNeverOKs(ref HandleRef) error {
	var (
		errs []error
		done map[shkShkNeverOkKey]bool
	)
	for _, h := range d.never.below[ref] {
		for _, k := range d.never.handles[h].keys {
			if len(d.neverRefs[k]) < 2 || done[k] {
				continue
			}
			if done == nil {
				done = map[shkShkNeverOkKey]bool{}
			}
			done[k] = true
			errs = append(errs, d.writeNeverOK(k))
		}
	}
	return errors.Join(errs...)
}

// writeNeverOK points k's entry at the best handle naming it; d.mu held.
func (d *Dataplane) writeNeverOK(k shkShkNeverOkKey) error {
	d.never.evals++
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
		d.nameNeverOK(k, HandleRef{Slot: r.Handle, Generation: r.Generation})
	}
}
