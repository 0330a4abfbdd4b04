package dnsresolver

import (
	"cmp"
	"slices"
)

// The resolver's bounded tables (the answer cache, the prepared replies,
// the remembered decisions, the write memo) are shared by every session, and
// one session can fill any of them: a flood of distinct names, each answered
// once. When one is full it forgets the sessions holding the most, largest
// first, until it is three quarters full: the sessions that filled it pay
// for it (extra upstream queries, full-path answers, decisions asked again,
// map writes), and the others keep what they hold. One walk of the sessions
// makes room for a quarter of the table's adds, so a host of many sessions
// holding a few entries each does not walk them all at every add once full.

// roomFor is how many entries a full table of max entries keeps after it
// makes room.
func roomFor(max int) int { return max * 3 / 4 }

// largestFirst returns the names of the parts a table drops to make room:
// the largest first, until what is left holds at most keep of the n
// entries held in all. size says how many entries a part holds.
func largestFirst[P any](parts map[string]P, size func(P) int, n, keep int) []string {
	type part struct {
		name string
		n    int
	}
	all := make([]part, 0, len(parts))
	for name, p := range parts {
		all = append(all, part{name, size(p)})
	}
	slices.SortFunc(all, func(a, b part) int { return cmp.Compare(b.n, a.n) })
	var drop []string
	for _, p := range all {
		if n <= keep {
			break
		}
		n -= p.n
		drop = append(drop, p.name)
	}
	return drop
}
