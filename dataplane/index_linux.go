package dataplane

import "net/netip"

// The Go-side index of the egress entries: per session its prefixes (the
// kernel's tries cannot be listed by session), the cover check's index
// (cover_linux.go), the DNS-derived entries' due times (expiry_linux.go),
// and the occupancy counts per map; d.mu held.

func (d *Dataplane) indexPrefix(session uint32, p netip.Prefix) {
	set := d.prefixes[session]
	if set == nil {
		set = map[netip.Prefix]struct{}{}
		d.prefixes[session] = set
	}
	if _, ok := set[p]; !ok {
		set[p] = struct{}{}
		d.countPrefix(p, 1)
		c := d.cover[session]
		if c == nil {
			c = newCoverIndex()
			d.cover[session] = c
		}
		c.add(p)
	}
}

func (d *Dataplane) unindexPrefix(session uint32, p netip.Prefix) {
	if _, ok := d.prefixes[session][p]; ok {
		delete(d.prefixes[session], p)
		d.countPrefix(p, -1)
		d.cover[session].remove(p)
		d.dropExpiry(session, p)
	}
}

func (d *Dataplane) countPrefix(p netip.Prefix, n int) {
	i := 0
	if !p.Addr().Is4() {
		i = 2
	}
	if p.Bits() == p.Addr().BitLen() {
		i++
	}
	d.nEntries[i] += n
}
