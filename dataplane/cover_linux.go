package dataplane

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
)

// coverIndex is one session's index of its egress prefixes for the cover
// check (how many of the session's prefixes one kernel lookup may visit,
// MaxCover). The check costs O(bits + C × (bits + log n)), where C is the
// number of the session's non-exact prefixes (grant CIDRs, few) and n the
// number of its exact entries (DNS answers, many): it never scans the exact
// entries. An exact prefix (/32, /128) has nothing below it; a non-exact
// one needs only to know whether some exact entry lies inside each CIDR
// below it, which the ordered set of exact addresses answers in O(log n).
type coverIndex struct {
	cidrs map[netip.Prefix]struct{} // non-exact prefixes
	exact addrSet                   // addresses of the exact prefixes
}

func newCoverIndex() *coverIndex {
	return &coverIndex{cidrs: map[netip.Prefix]struct{}{}}
}

func isExact(p netip.Prefix) bool { return p.Bits() == p.Addr().BitLen() }

func (c *coverIndex) add(p netip.Prefix) {
	if isExact(p) {
		c.exact.insert(p.Addr())
		return
	}
	c.cidrs[p] = struct{}{}
}

func (c *coverIndex) remove(p netip.Prefix) {
	if isExact(p) {
		c.exact.delete(p.Addr())
		return
	}
	delete(c.cidrs, p)
}

// above counts the CIDRs that strictly contain p.
func (c *coverIndex) above(p netip.Prefix) int {
	if len(c.cidrs) == 0 {
		return 0
	}
	n := 0
	for bits := p.Bits() - 1; bits >= 0; bits-- {
		q, _ := p.Addr().Prefix(bits)
		if _, ok := c.cidrs[q]; ok {
			n++
		}
	}
	return n
}

// check refuses p (not yet indexed) when some address would then be covered
// by more of the session's prefixes than the kernel visits.
func (c *coverIndex) check(p netip.Prefix) error {
	above := c.above(p)
	if above+1 > MaxCover {
		return fmt.Errorf("%w: %s would sit below %d other prefixes (max %d in a chain)", ErrCoverTooDeep, p, above, MaxCover)
	}
	if isExact(p) {
		return nil
	}
	// deepest: the most of the session's prefixes one address strictly
	// inside p sits below, counting only those strictly inside p.
	deepest, at := 0, p
	if c.exact.anyIn(p) {
		deepest = 1
	}
	for q := range c.cidrs {
		if q.Bits() <= p.Bits() || q.Addr().Is4() != p.Addr().Is4() || !p.Contains(q.Addr()) {
			continue
		}
		n := 1
		for bits := q.Bits() - 1; bits > p.Bits(); bits-- {
			a, _ := q.Addr().Prefix(bits)
			if _, ok := c.cidrs[a]; ok {
				n++
			}
		}
		if c.exact.anyIn(q) {
			n++
		}
		if n > deepest {
			deepest, at = n, q
		}
	}
	if above+1+deepest > MaxCover {
		return fmt.Errorf("%w: %s would put an address of %s below %d prefixes (max %d)", ErrCoverTooDeep, p, at, above+1+deepest, MaxCover)
	}
	return nil
}

// addrSet is an ordered set of addresses (a treap): insert, delete and the
// first address at or after a given one, each O(log n) expected.
type addrSet struct {
	root *addrNode
	n    int
}

type addrNode struct {
	addr        netip.Addr
	prio        uint32
	left, right *addrNode
}

func (s *addrSet) insert(a netip.Addr) {
	var added bool
	s.root, added = treapInsert(s.root, a, rand.Uint32())
	if added {
		s.n++
	}
}

func treapInsert(t *addrNode, a netip.Addr, prio uint32) (*addrNode, bool) {
	if t == nil {
		return &addrNode{addr: a, prio: prio}, true
	}
	var added bool
	switch c := a.Compare(t.addr); {
	case c == 0:
		return t, false
	case c < 0:
		t.left, added = treapInsert(t.left, a, prio)
		if t.left.prio > t.prio {
			l := t.left
			t.left, l.right = l.right, t
			t = l
		}
	default:
		t.right, added = treapInsert(t.right, a, prio)
		if t.right.prio > t.prio {
			r := t.right
			t.right, r.left = r.left, t
			t = r
		}
	}
	return t, added
}

func (s *addrSet) delete(a netip.Addr) {
	var removed bool
	s.root, removed = treapDelete(s.root, a)
	if removed {
		s.n--
	}
}

func treapDelete(t *addrNode, a netip.Addr) (*addrNode, bool) {
	if t == nil {
		return nil, false
	}
	var removed bool
	switch c := a.Compare(t.addr); {
	case c < 0:
		t.left, removed = treapDelete(t.left, a)
	case c > 0:
		t.right, removed = treapDelete(t.right, a)
	default:
		return treapMerge(t.left, t.right), true
	}
	return t, removed
}

// treapMerge joins two treaps whose keys are ordered (every key of l below
// every key of r).
func treapMerge(l, r *addrNode) *addrNode {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.prio > r.prio:
		l.right = treapMerge(l.right, r)
		return l
	default:
		r.left = treapMerge(l, r.left)
		return r
	}
}

// ceil returns the least address at or after a.
func (s *addrSet) ceil(a netip.Addr) (netip.Addr, bool) {
	var best netip.Addr
	found := false
	for t := s.root; t != nil; {
		if t.addr.Compare(a) >= 0 {
			best, found = t.addr, true
			t = t.left
		} else {
			t = t.right
		}
	}
	return best, found
}

// anyIn reports whether some address of the set lies in p.
func (s *addrSet) anyIn(p netip.Prefix) bool {
	a, ok := s.ceil(p.Masked().Addr())
	return ok && p.Contains(a)
}
