package capability

// fs.scope nesting: narrowest wins inside one grant. Of the entries of
// one axis (read, write or delete) and the grant's deny entries that cover
// a path, the deepest decides (backend.NarrowestAt), so write /repo,
// deny /repo/a, write /repo/a/b give /repo and /repo/a/b and not the rest
// of /repo/a. The axes are independent: a deny takes each axis only where
// it is deeper than that axis's entry, and write or delete never imply
// read. Across grants the rights add up (backend.FileRightsAt).

import (
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// MaxFSNesting bounds how often one axis of one grant may come back under
// a deny of the same grant on one chain of paths (write /a, deny /a/b,
// write /a/b/c is two levels). The decision engine's fixed Cedar policy
// has one pair of sets per level (FSLevels); a deeper grant is refused
// with a clear error and can be split across grants, where nesting is
// free.
const MaxFSNesting = 4

// FSLevel is one level of an axis's nesting: Allow are the axis's entries
// at this level (under Level-1 denies of the grant, or under none for the
// first), Deny the grant's deny entries that take this level's Allow
// entries above them (a deny under no entry of the axis takes nothing of
// it and is in no level).
type FSLevel struct {
	Allow, Deny []string
}

// FSLevels splits one axis's entries (allow) and the grant's deny entries
// into nesting levels, so that a path p is given iff for some level i some
// Allow of level i covers p and no Deny of level i does: along p's chain
// the levels only grow (an entry's level is fixed by the entries above
// it), level i's denies lie below level i's allows and above level i+1's,
// so the deepest entry on the chain is an allow exactly when its level has
// no deny on the chain. A path in both allow and deny counts as a deny
// (the grammar refuses that tie). Sorted by level; within a level, as the
// lists are. This is what lets a fixed Cedar condition, with no
// quantifiers, say narrowest-wins: agent/policy/classes.go.
func FSLevels(allow, deny []string) []FSLevel {
	type node struct {
		p     string
		deny  bool
		level int
	}
	var ns []node
	for _, a := range allow {
		if !slices.Contains(deny, a) {
			ns = append(ns, node{p: a})
		}
	}
	for _, d := range deny {
		ns = append(ns, node{p: d, deny: true})
	}
	// Ancestors first: a path's ancestors are shorter.
	slices.SortStableFunc(ns, func(a, b node) int { return len(a.p) - len(b.p) })
	var out []FSLevel
	for i := range ns {
		n := &ns[i]
		up := -1
		for j := range i {
			if ns[j].p != n.p && backend.PathUnder(n.p, ns[j].p) && (up < 0 || len(ns[j].p) > len(ns[up].p)) {
				up = j
			}
		}
		switch {
		case !n.deny && up < 0:
			n.level = 1
		case !n.deny && !ns[up].deny:
			n.level = ns[up].level
		case !n.deny:
			n.level = ns[up].level + 1 // under a deny (a level-0 one: level 1)
		case up < 0:
			n.level = 0 // a deny under nothing of the axis
		default:
			n.level = ns[up].level
		}
		if n.level == 0 {
			continue
		}
		for len(out) < n.level {
			out = append(out, FSLevel{})
		}
		if n.deny {
			out[n.level-1].Deny = append(out[n.level-1].Deny, n.p)
		} else {
			out[n.level-1].Allow = append(out[n.level-1].Allow, n.p)
		}
	}
	return out
}

// validateFSNesting refuses the truly contradictory (one path both given
// and denied by one grant) and nesting deeper than MaxFSNesting.
func validateFSNesting(s *FSScope) error {
	for _, l := range []struct {
		key   string
		paths []string
	}{{"read", s.Read}, {"write", s.Write}, {"delete", s.Delete}, {"connect", s.Connect}} {
		for _, p := range l.paths {
			if slices.Contains(s.Deny, p) {
				return fmt.Errorf("%w: fs.scope names %q in both %s and deny of one grant: contradictory (nesting is narrowest-wins: give or deny a deeper path instead)", ErrInvalidCapability, p, l.key)
			}
		}
		if l.key == "connect" {
			continue
		}
		if n := len(FSLevels(l.paths, s.Deny)); n > MaxFSNesting {
			return fmt.Errorf("%w: fs.scope %s comes back under the same grant's deny %d times on one path, at most %d in one grant (split the deeper part into a grant of its own: across grants the rights add up)", ErrInvalidCapability, l.key, n, MaxFSNesting)
		}
	}
	return nil
}

// fsGivesAt reports whether axis op of s gives p (narrowest wins).
func fsGivesAt(s *FSScope, op, p string) bool {
	switch op {
	case "read":
		return backend.NarrowestAt(s.Read, s.Deny, p)
	case "write":
		return backend.NarrowestAt(s.Write, s.Deny, p)
	case "delete":
		return backend.NarrowestAt(s.Delete, s.Deny, p)
	case "connect":
		return slices.Contains(s.Connect, p) && !slices.Contains(s.Deny, p)
	}
	return false
}

// fsWithin reports the first path where in gives an axis that bound does
// not. Exact: what either scope gives is fixed along a path's chain by its
// deepest entry of either scope, so comparing at every entry path of both
// compares everywhere (a path under no entry is given by neither).
func fsWithin(in, bound *FSScope) (op, path string, ok bool) {
	var points []string
	for _, s := range []*FSScope{in, bound} {
		for _, l := range [][]string{s.Read, s.Write, s.Delete, s.Deny} {
			points = append(points, l...)
		}
	}
	for _, op := range []string{"read", "write", "delete"} {
		for _, p := range points {
			if fsGivesAt(in, op, p) && !fsGivesAt(bound, op, p) {
				return op, p, false
			}
		}
	}
	for _, p := range in.Connect {
		if fsGivesAt(in, "connect", p) && !fsGivesAt(bound, "connect", p) {
			return "connect", p, false
		}
	}
	return "", "", true
}
