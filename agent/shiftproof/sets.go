package shiftproof

// Set expressions: literal sets, the free string-set attributes (witness
// slots) and the key sets derived from the request, and how many slots a
// free set needs.

import (
	"fmt"
	"strings"

	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
)

// slotNames lists the slots of a free set: (element, in-the-set bit).
func (e *enc) slotNames(path string) [][2]string {
	var out [][2]string
	for i := 0; i < e.slots[path]; i++ {
		b := fmt.Sprintf("%s_%d", freeSets[path], i)
		out = append(out, [2]string{b, b + "_in"})
	}
	return out
}

// member: the string/entity term x is in the set s.
func (e *enc) member(s, x term) string {
	switch s.sk {
	case setLit:
		var xs []string
		for _, el := range s.elems {
			xs = append(xs, eqTerms(el, x))
		}
		return or(xs...)
	case setFree:
		if x.k != kString {
			return "false"
		}
		var xs []string
		for _, sl := range e.slotNames(s.name) {
			xs = append(xs, and(sl[1], eq(sl[0], x.v)))
		}
		return or(xs...)
	case setDerived:
		if x.k != kString {
			return "false"
		}
		if x.lit {
			return memberLit(s.name, x.s)
		}
		if m, ok := memberTerm(s.name, x.v); ok {
			return m
		}
		refuse("a non-literal string tested against %s keys (only literals have a closed form there)", s.name)
	}
	return "false"
}

func (e *enc) contains(s, x term) term {
	if s.err == "true" || x.err == "true" || s.k != kSet {
		return errTerm
	}
	return term{k: kBool, v: e.member(s, x), err: or(s.err, x.err)}
}

func (e *enc) containsAny(a, b term) term {
	if a.err == "true" || b.err == "true" || a.k != kSet || b.k != kSet {
		return errTerm
	}
	err := or(a.err, b.err)
	if a.sk != setLit && b.sk == setLit {
		a, b = b, a
	}
	var xs []string
	switch {
	case a.sk == setLit:
		for _, el := range a.elems {
			xs = append(xs, e.member(b, el))
		}
	case a.sk == setFree && b.sk == setFree:
		for _, x := range e.slotNames(a.name) {
			for _, y := range e.slotNames(b.name) {
				xs = append(xs, and(x[1], y[1], eq(x[0], y[0])))
			}
		}
	case a.sk == setDerived && b.sk == setDerived:
		refuse("containsAny between two request key sets")
	default:
		if a.sk == setDerived {
			a, b = b, a
		}
		for _, x := range e.slotNames(a.name) {
			m, ok := memberTerm(b.name, x[0])
			if !ok {
				refuse("containsAny between %s and %s keys", a.name, b.name)
			}
			xs = append(xs, and(x[1], m))
		}
	}
	return term{k: kBool, v: or(xs...), err: err}
}

// containsAll: a ⊇ b.
func (e *enc) containsAll(a, b term) term {
	if a.err == "true" || b.err == "true" || a.k != kSet || b.k != kSet {
		return errTerm
	}
	err := or(a.err, b.err)
	var xs []string
	switch {
	case b.sk == setLit:
		for _, el := range b.elems {
			xs = append(xs, e.member(a, el))
		}
	case b.sk == setFree && a.sk != setFree:
		for _, x := range e.slotNames(b.name) {
			xs = append(xs, "(=> "+x[1]+" "+e.member(a, term{k: kString, v: x[0], err: "false"})+")")
		}
	default:
		refuse("containsAll with %s on the right", b.name)
	}
	return term{k: kBool, v: and(xs...), err: err}
}

func (e *enc) isEmpty(a term) term {
	if a.err == "true" || a.k != kSet {
		return errTerm
	}
	switch a.sk {
	case setLit:
		return term{k: kBool, v: fmt.Sprint(len(a.elems) == 0), err: a.err}
	case setFree:
		var xs []string
		for _, x := range e.slotNames(a.name) {
			xs = append(xs, not(x[1]))
		}
		return term{k: kBool, v: and(xs...), err: a.err}
	}
	if a.name == "cidr" || a.name == "port" {
		// The agent builds these at the lengths some policy or grant
		// names only: whether they are empty depends on that, not on the
		// request alone.
		refuse("isEmpty on %s keys (built only at the key lengths the policies and grants name)", a.name)
	}
	return term{k: kBool, v: not(derivedPresent(a.name)), err: a.err}
}

// slotNeed counts, over a policy, how many elements each free set needs to
// witness every observation the policy makes of it: one per contains,
// containsAny and isEmpty (and per "lit.containsAll(set)"), the literal's
// size for "set.containsAll(lit)". A counterexample with larger sets stays
// one when each set is cut down to these witnesses (every observation keeps
// its value: a true one keeps its witness, a false one stays false on a
// subset), so this many slots lose no counterexample.
func slotNeed(p *xast.Policy, need map[string]int) {
	freeOf := func(n xast.IsNode) string {
		a, ok := n.(xast.NodeTypeAccess)
		if !ok {
			return ""
		}
		var path []string
		for {
			path = append([]string{string(a.Value)}, path...)
			switch x := a.Arg.(type) {
			case xast.NodeTypeAccess:
				a = x
				continue
			case xast.NodeTypeVariable:
				full := string(x.Name) + "." + strings.Join(path, ".")
				if _, ok := freeSets[full]; ok {
					return full
				}
			}
			return ""
		}
	}
	litSize := func(n xast.IsNode) int {
		switch x := n.(type) {
		case xast.NodeTypeSet:
			return len(x.Elements)
		case xast.NodeValue:
			if s, ok := x.Value.(types.Set); ok {
				return s.Len()
			}
		}
		return 1
	}
	for _, c := range p.Conditions {
		xast.Inspect(xast.NewNode(c.Body), func(n xast.IsNode) bool {
			var l, r xast.IsNode
			switch x := n.(type) {
			case xast.NodeTypeContains:
				l, r = x.Left, x.Right
			case xast.NodeTypeContainsAny:
				l, r = x.Left, x.Right
			case xast.NodeTypeContainsAll:
				if f := freeOf(x.Left); f != "" {
					need[f] += litSize(x.Right)
				}
				if f := freeOf(x.Right); f != "" {
					need[f]++
				}
				return true
			case xast.NodeTypeIsEmpty:
				l = x.Arg
			default:
				return true
			}
			for _, side := range []xast.IsNode{l, r} {
				if side == nil {
					continue
				}
				if f := freeOf(side); f != "" {
					need[f]++
				}
			}
			return true
		})
	}
}
