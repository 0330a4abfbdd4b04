package agent

import "strings"

// UseDecision is a use-time answer for an enforcer that asks before it acts
// (the tool runner, the resolver, a future proxy): the capabilities.md
// queries may_egress, may_path, may_dispatch, may_exec ... are UseRequests
// of the matching class and op.
type UseDecision struct {
	Session string     `json:"session"`
	Request UseRequest `json:"request"`
	Allowed bool       `json:"allowed"`
	// DecidedBy is the rule that decided: the permit that allowed (a
	// "grant:<id>" policy is a live grant; any other id is a shipped or
	// admin policy), the forbid that denied (forbids override), or
	// "default-deny" when no permit matched.
	DecidedBy string   `json:"decided_by"`
	Reasons   []string `json:"reasons,omitempty"`
	Errors    []string `json:"errors,omitempty"`
}

// DefaultDeny names the rule of a denial no forbid made: nothing permitted it.
const DefaultDeny = "default-deny"

// DecideUse answers a use-time request (Decide: the base and admin policies,
// hard-deny forbids included, plus the session's live grants, whose policies
// exist exactly while their handles are live and unexpired) and names the
// rule that decided.
func (a *Agent) DecideUse(session string, r UseRequest) (UseDecision, error) {
	d, err := a.Decide(session, r)
	if err != nil {
		return UseDecision{}, err
	}
	return UseDecision{Session: session, Request: r, Allowed: d.Allowed, Reasons: d.Reasons, Errors: d.Errors, DecidedBy: d.decidedBy()}, nil
}

// decidedBy names the rule that decided: the first reason, preferring an
// admin or hard-deny rule by name over a grant when both decided, or
// DefaultDeny when no policy did.
func (d Decision) decidedBy() string {
	if len(d.Reasons) == 0 {
		return DefaultDeny
	}
	for _, r := range d.Reasons {
		if !strings.HasPrefix(r, "grant:") {
			return r
		}
	}
	return d.Reasons[0]
}
