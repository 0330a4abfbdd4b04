package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/agent/shiftproof"
)

// ShiftProofTimeout bounds each solver query of CheckShift (two per check,
// one per action, run in parallel). A query that runs out is "unknown" and
// the edit is treated as widening.
var ShiftProofTimeout = 10 * time.Second

// shiftDomain is the prover's request space with the grammar's classes (the
// resources a request can name), so a class that lands needs no edit of
// agent/shiftproof unless its requests carry a key kind the prover does not
// model yet.
var shiftDomain = func() shiftproof.Domain {
	d := shiftproof.ShinkenDomain
	d.Classes = nil
	for _, c := range capability.Classes {
		d.Classes = append(d.Classes, string(c))
	}
	return d
}()

// CheckShift answers "does the new set permit any request the old one
// denied?" with a proof: an edit that only adds forbids and removes permits
// is non-widening by construction; any other edit goes to the SMT solver
// (agent/shiftproof). Unsat is a proof over every request; sat yields a
// model that becomes a concrete request, which the real authorizer must
// permit under the new set and deny under the old before it is reported;
// unknown, a timeout, a construct outside the provable subset or an
// unconfirmed model leave Unproved set, and the edit is treated as widening.
// See agent/README.md §5.
func (e *Engine) CheckShift(old, neu cedar.PolicyMap) *capability.ShiftReport {
	start := time.Now()
	rep := &capability.ShiftReport{}
	defer func() { rep.Elapsed = time.Since(start) }()
	if why := prunedKeyRefusal(old, neu); why != "" {
		rep.Unproved = why
		return rep
	}
	// A use-time decision is the set plus the session's live grants: the
	// prover counts every use request as one some grant may permit.
	res, err := shiftproof.Prove(context.Background(), old, neu, shiftproof.Options{Timeout: ShiftProofTimeout, Domain: &shiftDomain, Grants: true})
	if err != nil {
		rep.Solver = shiftproof.Unknown.String()
		rep.Unproved = err.Error()
		return rep
	}
	rep.Abstracted = res.Abstracted
	if res.Trivial {
		rep.Proved = true
		return rep
	}
	rep.Solver = res.Verdict.String()
	switch res.Verdict {
	case shiftproof.Unsat:
		rep.Proved = true
	case shiftproof.Unknown:
		rep.Unproved = "the solver could not decide: " + res.Reason
	case shiftproof.Sat:
		ce, err := confirm(old, neu, res.Counterexample)
		if err != nil {
			rep.Unproved = err.Error()
			return rep
		}
		rep.Counterexample = ce
	}
	return rep
}

// errUnconfirmed: the solver's model is not a request the real authorizer
// permits under the new set and denies under the old one.
var errUnconfirmed = errors.New("the solver's counterexample was not confirmed by the authorizer")

// confirm turns the solver's request into the agent's Counterexample by the
// agent's own request encoding (UseRequest.context) and checks it with
// cedar-go: allowed by the new set, denied by the old.
func confirm(old, neu cedar.PolicyMap, r *shiftproof.Request) (*capability.Counterexample, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: no model", errUnconfirmed)
	}
	pr := capability.SessionAttrs{ID: r.Session.ID, Image: r.Session.Image, TrustTier: r.Session.TrustTier, Risk: r.Session.Risk,
		Headless: r.Session.Headless, TLSInspection: r.Session.TLSInspection, Protected: r.Session.Protected, PolicyStore: r.Session.PolicyStore}
	ce := &capability.Counterexample{Principal: pr, Action: r.Action, Class: capability.Class(r.Class)}
	req := cedar.Request{Principal: sessionUID(pr.ID), Resource: capabilityUID(capability.Class(r.Class))}
	if r.Action == "use" {
		u := capability.UseRequest{Class: capability.Class(r.Class), Op: r.Op, Domain: r.Domain, IP: r.IP, Path: r.Path, Item: r.Item, Mode: r.Mode}
		if hasPorts(u.Class) {
			u.Port = r.Port
		}
		if err := u.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errUnconfirmed, r, err)
		}
		ce.Use = &u
		req.Action, req.Context = actionUse, useContext(u, r.Now)
	} else {
		ce.Grant = fmt.Sprintf("tier=%s provenance=%s lifecycle=%s scope{write_keys=%q tls_inspect=%t mode=%q flags=%q}",
			r.Tier, r.Provenance, r.Lifecycle, r.WriteKeys, r.TLSInspect, r.ScopeMode, r.Flags)
		req.Action = actionGrant
		req.Context = types.NewRecord(types.RecordMap{
			"now": types.NewDatetime(r.Now), "tier": types.String(r.Tier), "provenance": types.String(r.Provenance),
			"lifecycle": types.String(r.Lifecycle),
			"scope": types.NewRecord(types.RecordMap{
				"write_keys": stringSet(r.WriteKeys), "tls_inspect": types.Boolean(r.TLSInspect),
				"mode": types.String(r.ScopeMode), "flags": stringSet(r.Flags),
			}),
		})
	}
	ents := types.EntityMap{sessionUID(pr.ID): sessionEntity(pr)}
	nd, diag := cedar.Authorize(neu, ents, req)
	od, _ := cedar.Authorize(old, ents, req)
	if (nd != cedar.Allow || od != cedar.Deny) && r.Action == "use" {
		// Under a live grant covering the request (the set plus any grant
		// is what a use-time decision evaluates).
		ng, og := maps2(neu), maps2(old)
		ng[grantAllID], og[grantAllID] = grantAll, grantAll
		nd, diag = cedar.Authorize(ng, ents, req)
		od, _ = cedar.Authorize(og, ents, req)
	}
	if nd != cedar.Allow || od != cedar.Deny {
		return nil, fmt.Errorf("%w: %s (new set: %v, old set: %v)", errUnconfirmed, r, nd, od)
	}
	for _, reason := range diag.Reasons {
		ce.Policies = append(ce.Policies, string(reason.PolicyID))
	}
	return ce, nil
}

// WidensError is the refusal of a widening edit: an error wrapping
// ErrPolicyWidens with the counterexample, or with why non-widening could
// not be proven.
func WidensError(r *capability.ShiftReport) error {
	if r.Counterexample != nil {
		return fmt.Errorf("%w: %s", ErrPolicyWidens, r.Counterexample)
	}
	return fmt.Errorf("%w: not proven non-widening (treated as widening): %s", ErrPolicyWidens, r.Unproved)
}
