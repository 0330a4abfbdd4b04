package backend

import (
	"fmt"
	"net/netip"
	"slices"
)

// DenyEntry is one destination of the deny table: addresses in Prefix on a
// port in Lo..Hi (inclusive; 0..65535 is every port) are refused in the
// kernel before any grant is consulted, and before the never-list and its
// exceptions: no grant, however broad or admin-named, reaches it. The agent
// compiles it from the admin and hard-deny forbids whose condition is a
// destination (agent/policy: KernelForbids).
type DenyEntry struct {
	Prefix netip.Prefix
	Lo, Hi uint16
}

func (e DenyEntry) String() string {
	switch {
	case e.Lo == 0 && e.Hi == 0xffff:
		return e.Prefix.String()
	case e.Lo == e.Hi:
		return fmt.Sprintf("%s port %d", e.Prefix, e.Lo)
	}
	return fmt.Sprintf("%s ports %d-%d", e.Prefix, e.Lo, e.Hi)
}

// Validate checks the entry's shape.
func (e DenyEntry) Validate() error {
	p := e.Prefix
	switch {
	case !p.IsValid():
		return fmt.Errorf("%w: deny entry %v", ErrInvalidPrefix, p)
	case p.Addr().Zone() != "":
		return fmt.Errorf("%w: deny entry %v has a zone", ErrInvalidPrefix, p)
	case p.Masked() != p:
		return fmt.Errorf("%w: deny entry %v has host bits set", ErrInvalidPrefix, p)
	case p.Addr().Is4In6():
		return fmt.Errorf("%w: deny entry %v is IPv4-mapped IPv6; use the IPv4 form", ErrInvalidPrefix, p)
	case e.Lo > e.Hi:
		return fmt.Errorf("%w: deny entry ports %d-%d are empty", ErrInvalidPorts, e.Lo, e.Hi)
	}
	return nil
}

// MaxDenyEntries is how many prefixes the deny table holds per address
// family (shk_deny4|6's max_entries; each entry is a bitmap of the 65,536
// ports, 8 KiB).
const MaxDenyEntries = 1024

// DenyRange is one port range of a deny-table entry (inclusive).
type DenyRange struct{ Lo, Hi uint16 }

// DenyTable is the deny table as a kernel holds it: each prefix named by
// some entry, with the port ranges of every entry covering it (its own and
// those of every shorter prefix containing it), merged and sorted, so one
// longest-prefix lookup of an address finds every range refused there.
// Both backends build their tables with it; more than MaxDenyEntries
// prefixes of one family is ErrMapFull.
func DenyTable(entries []DenyEntry) (map[netip.Prefix][]DenyRange, error) {
	own := map[netip.Prefix][]DenyRange{}
	for _, e := range entries {
		if err := e.Validate(); err != nil {
			return nil, err
		}
		own[e.Prefix] = append(own[e.Prefix], DenyRange{e.Lo, e.Hi})
	}
	var n4 int
	for p := range own {
		if p.Addr().Is4() {
			n4++
		}
	}
	if n4 > MaxDenyEntries || len(own)-n4 > MaxDenyEntries {
		return nil, fmt.Errorf("%w: deny table: %d IPv4 and %d IPv6 prefixes (at most %d each)", ErrMapFull, n4, len(own)-n4, MaxDenyEntries)
	}
	out := make(map[netip.Prefix][]DenyRange, len(own))
	for p := range own {
		var rs []DenyRange
		for q, qr := range own {
			if q.Addr().Is4() == p.Addr().Is4() && q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				rs = append(rs, qr...)
			}
		}
		out[p] = mergeRanges(rs)
	}
	return out, nil
}

// mergeRanges sorts rs and joins overlapping and adjacent ranges.
func mergeRanges(rs []DenyRange) []DenyRange {
	slices.SortFunc(rs, func(a, b DenyRange) int { return int(a.Lo) - int(b.Lo) })
	var out []DenyRange
	for _, r := range rs {
		if n := len(out); n > 0 && uint32(r.Lo) <= uint32(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Denied reports whether the table (DenyTable's) refuses addr:port: the
// longest prefix holding addr decides, as the kernel's lookup does.
func Denied(table map[netip.Prefix][]DenyRange, addr netip.Addr, port uint16) bool {
	addr = addr.Unmap()
	for bits := addr.BitLen(); bits >= 0; bits-- {
		p, _ := addr.Prefix(bits)
		rs, ok := table[p]
		if !ok {
			continue
		}
		for _, r := range rs {
			if port >= r.Lo && port <= r.Hi {
				return true
			}
		}
		return false
	}
	return false
}
