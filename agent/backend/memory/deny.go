package memory

import (
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// ---- the deny table and the never-list exceptions' re-derivation ----

// SetDenyList replaces the deny table: destinations Connect refuses before
// any grant and before the never-list (ReasonForbidden), as the kernel's
// shk_deny4|6 do. Only the entries that change are written (DenyWrites
// counts them).
func (b *Backend) SetDenyList(entries []backend.DenyEntry) error {
	t, err := backend.DenyTable(entries)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for p, rs := range t {
		if old, ok := b.denyTable[p]; !ok || !slices.Equal(old, rs) {
			b.denyOps++
		}
	}
	for p := range b.denyTable {
		if _, ok := t[p]; !ok {
			b.denyOps++
		}
	}
	b.denyTable = t
	return nil
}

// DenyList returns the deny table in force (prefix -> port ranges, pushed
// down as the kernel holds it).
func (b *Backend) DenyList() map[string][]backend.DenyRange {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string][]backend.DenyRange{}
	for p, rs := range b.denyTable {
		out[p.String()] = slices.Clone(rs)
	}
	return out
}

// DenyWrites counts the deny-table entries SetDenyList wrote or deleted
// since New.
func (b *Backend) DenyWrites() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.denyOps
}

// SetNeverOK sets whether the session's rule r (SameRule, NeverOK aside)
// is an exception to the never-list.
func (b *Backend) SetNeverOK(name string, r backend.EgressRule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.NeverOK && (r.Prefix.Bits() != r.Prefix.Addr().BitLen() || r.Ports.Lo != r.Ports.Hi) {
		return fmt.Errorf("%w: a never-list exception names one address and one port (or every port): %s", backend.ErrInvalidPrefix, r)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[name]
	if !ok {
		return fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	e, ok := s.entries[r.Prefix]
	if ok {
		for i, o := range e.rules {
			was := o.NeverOK
			o.NeverOK = r.NeverOK
			if !backend.SameRule(o, r) {
				continue
			}
			if was == r.NeverOK {
				return nil
			}
			e.rules[i].NeverOK = r.NeverOK
			if r.NeverOK {
				b.addNeverOK(neverKeyOf(s.Index, r), r.Handle)
			} else {
				b.dropNeverOK(neverKeyOf(s.Index, r), r.Handle)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %s in session %s", backend.ErrRuleNotFound, r, name)
}
