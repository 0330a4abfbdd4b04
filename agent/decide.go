package agent

// DecideUse answers a use-time request (Decide: the base and admin policies,
// hard-deny forbids included, plus the session's live grants, whose policies
// exist exactly while their handles are live and unexpired) and names the
// rule that decided.
func (a *Agent) DecideUse(session string, r UseRequest) (UseDecision, error) {
	d, err := a.Decide(session, r)
	if err != nil {
		return UseDecision{}, err
	}
	return UseDecision{Session: session, Request: r, Allowed: d.Allowed, Reasons: d.Reasons, Errors: d.Errors, DecidedBy: d.DecidedBy()}, nil
}
