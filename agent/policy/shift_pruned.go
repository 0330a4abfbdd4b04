package policy

// The gate and the production request encoding: Decide builds cidr_keys
// and port_keys only at the lengths some base policy literal or some grant
// of the session names (keyLens). A policy that only asks whether such a
// set holds a literal reads the same answer either way (the literal's
// length is always built); one that reads the set otherwise (isEmpty, a
// non-literal element, a comparison with another set) sees a set that
// changes with the lengths in force. CheckShift refuses, as unproven, an
// edit that changes such a policy, or that changes the lengths while such
// a policy is in either set; an unchanged one under the same lengths is
// abstracted by the prover (the same unknown in both sets).

import (
	"fmt"

	cedar "github.com/cedar-policy/cedar-go"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
)

// prunedKeyRead says how p reads cidr_keys or port_keys beyond literal
// membership ("" when it does not).
func prunedKeyRead(p *cedar.Policy) string {
	a := (*xast.Policy)(p.AST())
	total, literal := 0, 0
	for _, c := range a.Conditions {
		xast.Inspect(xast.NewNode(c.Body), func(n xast.IsNode) bool {
			switch v := n.(type) {
			case xast.NodeTypeAccess:
				if requestKey(v) != "" {
					total++
				}
			case xast.NodeTypeContains:
				if _, ok := literalString(v.Right); ok && requestKey(v.Left) != "" {
					literal++
				}
			case xast.NodeTypeContainsAny:
				if _, ok := literalStrings(v.Right); ok && requestKey(v.Left) != "" {
					literal++
				}
			case xast.NodeTypeContainsAll:
				if _, ok := literalStrings(v.Right); ok && requestKey(v.Left) != "" {
					literal++
				}
			}
			return true
		})
	}
	if total > literal {
		return "reads context.request.cidr_keys or port_keys other than as .contains/.containsAny/.containsAll of literals " +
			"(Decide builds those keys only at the lengths the policies and grants name)"
	}
	return ""
}

// lensOf is the key lengths the literals of a policy set name (as load
// computes them).
func lensOf(pm cedar.PolicyMap) keyLens {
	var lit literals
	for _, p := range pm {
		lit.collect(p)
	}
	var k keyLens
	for _, p := range lit.ips {
		k.addPrefix(p)
	}
	for _, s := range lit.strs {
		k.addPortBlock(s)
	}
	return k
}

// prunedKeyRefusal says why an edit from old to neu cannot be proven in
// the prover's world of full key sets ("" when it can).
func prunedKeyRefusal(old, neu cedar.PolicyMap) string {
	oldText := map[string]bool{}
	for _, p := range old {
		oldText[string(p.MarshalCedar())] = true
	}
	newText := map[string]bool{}
	for _, p := range neu {
		newText[string(p.MarshalCedar())] = true
	}
	sameLens := lensOf(old) == lensOf(neu)
	for _, side := range []struct {
		set   cedar.PolicyMap
		other map[string]bool
	}{{old, newText}, {neu, oldText}} {
		for id, p := range side.set {
			why := prunedKeyRead(p)
			if why == "" {
				continue
			}
			changed := !side.other[string(p.MarshalCedar())]
			if changed || !sameLens {
				what := "it changes"
				if !changed {
					what = "the edit changes the key lengths the policies name"
				}
				pos := p.Position()
				return fmt.Sprintf("policy %s (%s:%d) %s, and %s", id, pos.Filename, pos.Line, why, what)
			}
		}
	}
	return ""
}

// grantAll stands for "some live grant permits this use request" in a
// counterexample's confirmation.
var grantAll = func() *cedar.Policy {
	var p cedar.Policy
	if err := p.UnmarshalCedar([]byte(`permit (principal, action == Shinken::Action::"use", resource);`)); err != nil {
		panic(err)
	}
	return &p
}()

// grantAllID names grantAll in a counterexample.
const grantAllID = "grant:(a live grant covering the request)"
