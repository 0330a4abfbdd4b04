package policy

// Policy changes: a proposed base set is loaded and validated beside the one
// in force, compared with it (CheckShift) and put in force only when the
// caller decides to (Install). The agent's policy gate (agent/policy_gate.go)
// drives these steps and records what it applied.

import cedar "github.com/cedar-policy/cedar-go"

// A Set is a validated base policy set (the shipped policies and a policy
// directory's) that is not in force yet.
type Set struct{ b *policyBase }

// Policies returns the set's policies.
func (s *Set) Policies() cedar.PolicyMap { return s.b.policies }

// LoadSet parses and validates the shipped policies and the *.cedar files of
// dir, with overlay (base name -> content) replacing files of the same name
// or adding them; it changes nothing in force. A set that does not parse or
// validate is reported as PolicyErrors (wrapping ErrPolicy).
func (e *Engine) LoadSet(dir string, overlay map[string][]byte) (*Set, error) {
	b, err := e.loadWith(dir, overlay)
	if err != nil {
		return nil, err
	}
	return &Set{b: b}, nil
}

// Policies returns the base set in force: shipped, hard-deny and policy
// directory policies, no grants.
func (e *Engine) Policies() cedar.PolicyMap { return e.base.Load().policies }

// Install puts s in force in place of the base set; the sessions' grants
// stay.
func (e *Engine) Install(s *Set) { e.base.Store(s.b) }
