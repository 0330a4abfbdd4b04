package dataplane

import (
	"fmt"
	"maps"

	"github.com/cilium/ebpf"
)

// The never-list hint (shk_never_hints, bpf/egress_map.bpf.h): which of the
// two never-list lookups of a connect or send can match at all, so that the
// kernel skips the ones that cannot: the port-specific lookup when no entry
// names the destination's port, the every-port lookup when no every-port
// entry of its family covers an address with its first byte. A set bit
// skips; all zero (the map as each load makes it: it is not pinned) skips
// nothing. The hint is written from the entries themselves, always a
// superset of what the maps hold: before entries are added it covers the
// old and the new, after stale ones are deleted it narrows to what is left.
// A reader that sees a half-written value sees bits of two supersets, each
// covering the entries in the maps at that moment. d.mu held.

// neverKeys is what shk_never4|6 hold.
func (d *Dataplane) neverKeys() (map[shkShkNever4Key]bool, map[shkShkNever6Key]bool, error) {
	k4, err := mapKeys[shkShkNever4Key](d.objs.ShkNever4)
	if err != nil {
		return nil, nil, err
	}
	k6, err := mapKeys[shkShkNever6Key](d.objs.ShkNever6)
	if err != nil {
		return nil, nil, err
	}
	return k4, k6, nil
}

// mapKeys is the set of keys of a never-list map (values uint32).
func mapKeys[K comparable](m *ebpf.Map) (map[K]bool, error) {
	keys := map[K]bool{}
	var k K
	it := m.Iterate()
	for it.Next(&k, new(uint32)) {
		keys[k] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("never-list: read: %w", err)
	}
	return keys, nil
}

func union[K comparable](a, b map[K]bool) map[K]bool {
	u := maps.Clone(a)
	maps.Copy(u, b)
	return u
}

// neverHint is the hint for the entries k4 and k6.
func neverHint(k4 map[shkShkNever4Key]bool, k6 map[shkShkNever6Key]bool) *shkShkNeverHint {
	var h shkShkNeverHint
	for i := range h.PortClear {
		h.PortClear[i] = 0xff
	}
	for i := range h.V4Clear {
		h.V4Clear[i] = 0xff
		h.V6Clear[i] = 0xff
	}
	entry := func(prefixlen uint32, port uint16, first uint8, byFirst *[32]uint8) {
		if port != 0 {
			p := port<<8 | port>>8 // the key's network order
			h.PortClear[p/8] &^= 1 << (p % 8)
			return
		}
		// Every port: the first bytes the prefix covers.
		bits := int(prefixlen) - 16
		lo, hi := int(first), int(first)
		if bits < 8 {
			mask := 0xff << (8 - max(bits, 0)) & 0xff
			lo = int(first) & mask
			hi = lo | ^mask&0xff
		}
		for b := lo; b <= hi; b++ {
			byFirst[b/8] &^= 1 << (b % 8)
		}
	}
	for k := range k4 {
		entry(k.Prefixlen, k.Port, k.Addr[0], &h.V4Clear)
	}
	for k := range k6 {
		entry(k.Prefixlen, k.Port, k.Addr[0], &h.V6Clear)
	}
	return &h
}

// writeNeverHint makes the hint say what k4 and k6 can match.
func (d *Dataplane) writeNeverHint(k4 map[shkShkNever4Key]bool, k6 map[shkShkNever6Key]bool) error {
	if err := d.objs.ShkNeverHints.Update(uint32(0), neverHint(k4, k6), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("never-list hint: %w", err)
	}
	return nil
}
