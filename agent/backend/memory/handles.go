package memory

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// slot is one entry of the handle table, as the kernel's struct shk_handle:
// a freed slot keeps its generation, and the next handle issued in it gets
// the next one, so references to the old handle stay dead.
type slot struct {
	state   backend.HandleState
	gen     uint32
	parent  backend.HandleRef
	expires time.Time // zero: never
}

// NewHandle issues a live handle, a child of parent when parent is not
// zero: parent and each of its ancestors must be alive and unexpired, and
// the chain no deeper than MaxChain with the new handle.
func (b *Backend) NewHandle(parent backend.HandleRef, expires time.Time) (backend.HandleRef, error) {
	return b.newHandle(parent, expires, backend.HandleLive)
}

// NewOnceHandle issues an approve-once handle: the first allowed Connect or
// Accept under it consumes it (HandleOnce to HandleUsed).
func (b *Backend) NewOnceHandle(parent backend.HandleRef, expires time.Time) (backend.HandleRef, error) {
	return b.newHandle(parent, expires, backend.HandleOnce)
}

func (b *Backend) newHandle(parent backend.HandleRef, expires time.Time, state backend.HandleState) (backend.HandleRef, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fault(OpNewHandle); err != nil {
		return backend.HandleRef{}, err
	}
	h := slot{state: state, expires: expires}
	if !parent.IsZero() {
		depth, err := b.chainDepth(parent)
		if err != nil {
			return backend.HandleRef{}, err
		}
		if depth >= MaxChain {
			return backend.HandleRef{}, fmt.Errorf("%w: parent %s is %d deep (max %d)", backend.ErrChainTooDeep, parent, depth, MaxChain)
		}
		h.parent = parent
	}
	n, err := b.slots.take()
	if err != nil {
		return backend.HandleRef{}, err
	}
	for uint32(len(b.handles)) <= n {
		b.handles = append(b.handles, slot{})
	}
	h.gen = b.handles[n].gen + 1
	if h.gen == 0 {
		h.gen = 1
	}
	b.handles[n] = h
	return backend.HandleRef{Slot: n, Generation: h.gen}, nil
}

// expired reports whether a deadline has passed (the kernel's now >=
// expires).
func (b *Backend) expired(t time.Time) bool { return !t.IsZero() && !b.cfg.Now().Before(t) }

// chainDepth checks that ref and its ancestors are alive and unexpired and
// returns how many handles the chain holds; b.mu held.
func (b *Backend) chainDepth(ref backend.HandleRef) (int, error) {
	for depth := 1; depth <= MaxChain+1; depth++ {
		h, err := b.readHandle(ref)
		if err != nil {
			return 0, err
		}
		if !h.state.Alive() {
			return 0, fmt.Errorf("%w: %s is %s", backend.ErrHandleNotLive, ref, h.state)
		}
		if b.expired(h.expires) {
			return 0, fmt.Errorf("%w: %s expired", backend.ErrHandleNotLive, ref)
		}
		if h.parent.IsZero() {
			return depth, nil
		}
		ref = h.parent
	}
	return 0, fmt.Errorf("%w: chain longer than %d", backend.ErrChainTooDeep, MaxChain)
}

// readHandle returns ref's slot: ErrInvalidHandle for a slot that cannot
// exist, ErrHandleNotLive for a freed or recycled one; b.mu held.
func (b *Backend) readHandle(ref backend.HandleRef) (slot, error) {
	if ref.Slot == 0 || ref.Slot >= b.cfg.MaxHandles {
		return slot{}, fmt.Errorf("%w: %s", backend.ErrInvalidHandle, ref)
	}
	var h slot
	if int(ref.Slot) < len(b.handles) {
		h = b.handles[ref.Slot]
	}
	if h.gen != ref.Generation || h.state == backend.HandleFree {
		return h, fmt.Errorf("%w: %s (slot is at generation %d, %s)", backend.ErrHandleNotLive, ref, h.gen, h.state)
	}
	return h, nil
}

// ancestorRevoked reports whether an ancestor of h is revoked, freed or
// recycled (h is dead without its own state word flipped); b.mu held.
func (b *Backend) ancestorRevoked(h slot) bool {
	for i := 0; !h.parent.IsZero() && i <= MaxChain; i++ {
		p, err := b.readHandle(h.parent)
		if err != nil || !p.state.Alive() {
			return true
		}
		h = p
	}
	return false
}

// Revoke flips ref's state word to revoked: one write, after which no use
// under ref or a descendant passes (the check walks the parent chain). A
// write is followed by one sweep (modelled: there are no open flows to
// cut). Revoking a handle already revoked, freed or recycled writes nothing.
func (b *Backend) Revoke(ref backend.HandleRef) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fault(OpRevoke); err != nil {
		return err
	}
	h, err := b.readHandle(ref)
	if errors.Is(err, backend.ErrHandleNotLive) {
		return nil
	}
	if err != nil {
		return err
	}
	if h.state == backend.HandleRevoked {
		return nil
	}
	b.handles[ref.Slot].state = backend.HandleRevoked
	b.ops.RevokeWrites++
	// An exception another grant still names must not die with this one.
	b.repointNeverOKs(ref)
	b.ops.Sweeps++
	b.sweeps.Sweeps++
	// The file views holding an entry the revoke killed are derived again
	// (the Linux backend's view sweep: one, if any view is reached).
	for _, s := range b.sessions {
		if slices.ContainsFunc(s.files, func(e backend.FileEntry) bool { return b.reaches(e.Handle, ref) }) {
			b.ops.ViewSweeps++
			break
		}
	}
	return nil
}

// reaches says whether a revoke of dead kills ref (backend.Reaches over
// the handle table); b.mu held.
func (b *Backend) reaches(ref, dead backend.HandleRef) bool {
	return backend.Reaches(ref, dead, MaxChain, func(r backend.HandleRef) (backend.HandleRef, bool) {
		if int(r.Slot) >= len(b.handles) || b.handles[r.Slot].gen != r.Generation {
			return backend.HandleRef{}, false
		}
		return b.handles[r.Slot].parent, true
	})
}

// Release reclaims what a dead grant held, in the Linux backend's order:
// the entries of d in session first (those gone, or a session gone, are no
// error), then ref's slot when ref is not zero. ref or an ancestor must
// already be revoked; otherwise the slot is refused (ErrInvalidHandle),
// after the entries were removed, as on Linux (see the package doc). A
// freed or recycled ref is no error.
func (b *Backend) Release(name string, ref backend.HandleRef, d backend.Delta) error {
	rules := d.AddressRules()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fault(OpRelease); err != nil {
		return err
	}
	free := false
	if !ref.IsZero() {
		h, err := b.readHandle(ref)
		switch {
		case errors.Is(err, backend.ErrHandleNotLive): // freed or recycled already
		case err != nil:
			return err
		case h.state != backend.HandleRevoked && !b.ancestorRevoked(h):
			return fmt.Errorf("%w: release %s: the handle and its ancestors are live", backend.ErrHandleLive, ref)
		default:
			free = true
		}
	}
	crash := b.crashPlan(OpRelease, len(rules))
	for i, r := range rules {
		crash.at(i)
		err := b.removeFrom(name, r)
		if err != nil && !errors.Is(err, backend.ErrRuleNotFound) && !errors.Is(err, backend.ErrSessionNotFound) {
			return fmt.Errorf("release %s: remove %s: %w", ref, r, err)
		}
	}
	crash.at(len(rules))
	if s, ok := b.sessions[name]; ok {
		s.removeFiles(d.Files)
		s.removeProcess(d.Process)
	}
	if !free {
		return nil
	}
	b.handles[ref.Slot].state = backend.HandleFree
	b.slots.put(ref.Slot)
	return nil
}

// HandleState reads ref's state word; a freed or recycled slot reads
// HandleFree.
func (b *Backend) HandleState(ref backend.HandleRef) (backend.HandleState, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, err := b.readHandle(ref)
	if errors.Is(err, backend.ErrHandleNotLive) {
		return backend.HandleFree, nil
	}
	if err != nil {
		return backend.HandleFree, err
	}
	return h.state, nil
}

// handlesLocked lists every slot that is not free, by slot; b.mu held.
func (b *Backend) handlesLocked() []backend.Handle {
	var out []backend.Handle
	for n, h := range b.handles {
		if n == 0 || h.state == backend.HandleFree {
			continue
		}
		out = append(out, backend.Handle{Ref: backend.HandleRef{Slot: uint32(n), Generation: h.gen}, State: h.state, Parent: h.parent, Expires: h.expires})
	}
	return out
}

// handleChain is h, then its ancestors as far as they can be read; b.mu
// held.
func (b *Backend) handleChain(h backend.HandleRef) []backend.HandleRef {
	chain := []backend.HandleRef{h}
	for r := h; len(chain) <= MaxChain; {
		v, err := b.readHandle(r)
		if err != nil || v.parent.IsZero() {
			break
		}
		r = v.parent
		chain = append(chain, r)
	}
	return slices.Clip(chain)
}
