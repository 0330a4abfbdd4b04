package agent

import "strings"

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
