package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The deny table (shk_deny4|6): destinations the connect and send hooks
// refuse before any grant and before the never-list, compiled by the agent
// from the admin and hard-deny forbids whose condition is a destination.
// Each entry is a bitmap of the ports refused there, those of every entry
// covering it included (backend.DenyTable pushes them down), so the kernel
// makes one longest-prefix lookup and one bit test (no loop) per connect, per unconnected send, per UDP reply
// admitted as one, and per flow without a verdict in packet mode; never one
// per packet of a flow that has its verdict.

// SetDenyList replaces the deny table, writing only the entries that
// change (added or changed first, then the stale ones deleted: a range
// kept never has a gap). When it refuses something it did not before, the
// open flows to what it now refuses are cut: one sweep in sweep mode (and
// its follow-ups, as after a revoke); in
// packet mode the flow records of such peers are dropped, so their next
// packet is decided afresh (and refused).
func (d *Dataplane) SetDenyList(entries []backend.DenyEntry) error {
	t, err := backend.DenyTable(entries)
	if err != nil {
		return err
	}
	d.mu.Lock()
	grew, err := d.setDenyTable(t)
	d.mu.Unlock()
	if err != nil || !grew {
		return err
	}
	if d.sweep != nil {
		// One sweep now, and the follow-ups a revoke schedules (a UDP
		// connect allowed just before the write may complete after it).
		_, err := d.sweep.run()
		d.sweep.followUp()
		return err
	}
	return d.dropDeniedFlows(t)
}

// DenyWrites counts the deny-table entries SetDenyList wrote or deleted
// since Open.
func (d *Dataplane) DenyWrites() uint64 { return d.ops.denyWrites.Load() }

// setDenyTable writes t into the maps; grew says whether some address and
// port is refused now that was not; d.mu held.
func (d *Dataplane) setDenyTable(t map[netip.Prefix][]backend.DenyRange) (grew bool, err error) {
	old, err := d.readDenyTable()
	if err != nil {
		return false, err
	}
	for p, rs := range t {
		o, ok := old[p]
		if ok && slices.Equal(o, rs) {
			continue
		}
		if !ok || !rangesWithin(rs, o) {
			grew = true
		}
		var v shkShkDeny
		for _, r := range rs {
			for port := uint32(r.Lo); port <= uint32(r.Hi); port++ {
				v.Ports[port>>3] |= 1 << (port & 7)
			}
		}
		m, k := d.denyKey(p)
		if err := m.Update(k, &v, ebpf.UpdateAny); err != nil {
			return grew, fmt.Errorf("deny table %s: %w", p, err)
		}
		d.ops.denyWrites.Add(1)
	}
	for p := range old {
		if _, ok := t[p]; ok {
			continue
		}
		// A shorter entry may now answer for addresses p held: a wider
		// refusal is possible only where it covers p, and then it was
		// pushed into p already; so deleting never refuses more.
		m, k := d.denyKey(p)
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return grew, fmt.Errorf("deny table %s: %w", p, err)
		}
		d.ops.denyWrites.Add(1)
	}
	return grew, nil
}

// rangesWithin reports whether every port of rs is in one of within's
// (both merged and sorted).
func rangesWithin(rs, within []backend.DenyRange) bool {
	for _, r := range rs {
		if !slices.ContainsFunc(within, func(w backend.DenyRange) bool { return w.Lo <= r.Lo && r.Hi <= w.Hi }) {
			return false
		}
	}
	return true
}

func (d *Dataplane) denyKey(p netip.Prefix) (*ebpf.Map, any) {
	if p.Addr().Is4() {
		return d.objs.ShkDeny4, shkShkDeny4Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
	}
	return d.objs.ShkDeny6, shkShkDeny6Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// readDenyTable reads what the maps hold; d.mu held.
func (d *Dataplane) readDenyTable() (map[netip.Prefix][]backend.DenyRange, error) {
	out := map[netip.Prefix][]backend.DenyRange{}
	ranges := func(v *shkShkDeny) []backend.DenyRange {
		var rs []backend.DenyRange
		for port := uint32(0); port <= 0xffff; port++ {
			if v.Ports[port>>3]&(1<<(port&7)) == 0 {
				continue
			}
			if n := len(rs); n > 0 && uint32(rs[n-1].Hi)+1 == port {
				rs[n-1].Hi = uint16(port)
			} else {
				rs = append(rs, backend.DenyRange{Lo: uint16(port), Hi: uint16(port)})
			}
		}
		return rs
	}
	var (
		k4 shkShkDeny4Key
		k6 shkShkDeny6Key
		v  shkShkDeny
	)
	it := d.objs.ShkDeny4.Iterate()
	for it.Next(&k4, &v) {
		out[netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen))] = ranges(&v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("deny table: %w", err)
	}
	it = d.objs.ShkDeny6.Iterate()
	for it.Next(&k6, &v) {
		out[netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen))] = ranges(&v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("deny table: %w", err)
	}
	return out, nil
}

// DenyTable reads the deny table the kernel holds (prefix -> port ranges,
// pushed down).
func (d *Dataplane) DenyTable() (map[netip.Prefix][]backend.DenyRange, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.readDenyTable()
}

// dropDeniedFlows (packet mode) deletes the flow records whose peer t
// refuses: the next packet of such a flow finds no verdict and is decided
// against the deny table (an inbound rule still keeps an accepted TCP flow).
func (d *Dataplane) dropDeniedFlows(t map[netip.Prefix][]backend.DenyRange) error {
	var stale []uint64
	err := eachEntry(d.objs.ShkFlows, func(cookie *uint64, f *shkShkFlow) {
		if f.Handle == 0 && f.Generation == 0 {
			return // DNS memory only: no verdict to drop
		}
		if backend.Denied(t, flowPeer(*f), f.PeerPort) {
			stale = append(stale, *cookie)
		}
	})
	if err != nil {
		return fmt.Errorf("flow records: %w", err)
	}
	var errs []error
	for _, c := range stale {
		if err := d.objs.ShkFlows.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// flowPeer is a flow record's peer address.
func flowPeer(f shkShkFlow) netip.Addr {
	var b [16]byte
	for i, w := range f.Peer {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
	}
	if f.PeerFamily == 2 { // AF_INET
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// SetNeverOK sets whether the session's rule r (the one sameRule names,
// the NeverOK flag aside) is an exception to the never-list: one write of
// its egress entry, and its shk_never_oks entry added, re-pointed or
// deleted.
func (d *Dataplane) SetNeverOK(session string, r EgressRule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.NeverOK && (r.Prefix.Bits() != r.Prefix.Addr().BitLen() || r.Ports.Lo != r.Ports.Hi) {
		return fmt.Errorf("%w: a never-list exception names one address and one port (or every port): %s", ErrInvalidPrefix, r)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[session]
	if !ok {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	val, exists, err := d.lookupEntry(s.Index, r.Prefix)
	if err != nil {
		return err
	}
	want := encodeRule(r)
	for i := uint32(0); exists && i < val.Nrules && i < MaxRules; i++ {
		o := val.Rules[i]
		o.Flags = o.Flags&^ruleNeverOK | want.Flags&ruleNeverOK
		if !sameRule(o, want) {
			continue
		}
		if o.Flags == val.Rules[i].Flags {
			return nil
		}
		val.Rules[i].Flags = o.Flags
		k := neverOKKey(s.Index, r)
		if r.NeverOK {
			// The exception first, then the rule that says it is one.
			if err := d.addNeverOK(k, r.Handle); err != nil {
				return fmt.Errorf("never-list exception %s: %w", r, err)
			}
			return d.writeEntry(s.Index, r.Prefix, &val, ebpf.UpdateExist)
		}
		if err := d.dropNeverOK(k, r.Handle); err != nil {
			return fmt.Errorf("never-list exception %s: %w", r, err)
		}
		return d.writeEntry(s.Index, r.Prefix, &val, ebpf.UpdateExist)
	}
	return fmt.Errorf("%w: %s in session %s", ErrRuleNotFound, r, session)
}
