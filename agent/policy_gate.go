package agent

// Policy changes through the permissiveness gate: diff and apply of
// proposed policy files (the API's POST /v1/policies, shinkenctl policy),
// and the restart check against the last applied set.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cedar "github.com/cedar-policy/cedar-go"

	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
	"github.com/shinken-agent/shinken/agent/policy"
)

// ErrNoPolicyDir: a change was proposed but the agent has no policy directory.
var ErrNoPolicyDir = errors.New("agent: no policy directory configured")

// overlay is a change's files by base name, each a *.cedar base name.
func overlay(c PolicyChange) (map[string][]byte, error) {
	if len(c.Files) == 0 {
		return nil, fmt.Errorf("%w: no policy files", ErrInvalidRequest)
	}
	out := map[string][]byte{}
	for name, text := range c.Files {
		if name != filepath.Base(name) || !strings.HasSuffix(name, ".cedar") || strings.HasPrefix(name, ".") {
			return nil, fmt.Errorf("%w: policy file name %q (want a base name ending in .cedar)", ErrInvalidRequest, name)
		}
		out[name] = []byte(text)
	}
	return out, nil
}

// PolicyDiff validates a change against the schema and compares it with the
// live set, changing nothing.
func (a *Agent) PolicyDiff(c PolicyChange) (*PolicyReport, error) {
	rep, _, err := a.policyCheck(c)
	return rep, err
}

func (a *Agent) policyCheck(c PolicyChange) (*PolicyReport, *policy.Set, error) {
	if a.cfg.PolicyDir == "" {
		return nil, nil, ErrNoPolicyDir
	}
	ov, err := overlay(c)
	if err != nil {
		return nil, nil, err
	}
	nb, err := a.engine.LoadSet(a.cfg.PolicyDir, ov)
	if err != nil {
		return nil, nil, err
	}
	sr := a.engine.CheckShift(a.engine.Policies(), nb.Policies())
	return &PolicyReport{Widens: sr.Widens(), Summary: sr.Summary(), Shift: sr, Forbids: nb.KernelForbids().Report()}, nb, nil
}

// ApplyPolicies puts a change in force if the gate proves it not wider
// (or c.AllowWidening): the files are written to the policy directory
// (atomically each), the set is swapped, the applied set is recorded for the
// restart check, and the outcome is an audited event. A refused change
// returns ErrPolicyWidens with the report (its counterexample).
func (a *Agent) ApplyPolicies(c PolicyChange) (*PolicyReport, error) {
	a.policyMu.Lock()
	defer a.policyMu.Unlock()
	// The proposal is recorded before the gate runs (a failure to record
	// refuses it).
	if err := a.emit(Event{Kind: EventPolicyPropose, Actor: c.Actor, Outcome: fmt.Sprintf("files=%d allow_widening=%t", len(c.Files), c.AllowWidening)}); err != nil {
		return nil, err
	}
	rep, nb, err := a.policyCheck(c)
	if err != nil {
		a.emit(Event{Kind: "policy.apply", Actor: c.Actor, Outcome: "refused: " + err.Error()})
		return rep, err
	}
	if rep.Widens && !c.AllowWidening {
		err := policy.WidensError(rep.Shift)
		a.emit(Event{Kind: "policy.apply", Actor: c.Actor, Outcome: "refused: " + rep.Summary})
		return rep, err
	}
	names := make([]string, 0, len(c.Files))
	for name := range c.Files {
		names = append(names, name)
	}
	slices.Sort(names)
	// The deny table first, then the files, then the engine and the
	// never-list exceptions (forbids.go).
	err = a.install(nb, func() error {
		for _, name := range names {
			if err := atomicfile.Write(filepath.Join(a.cfg.PolicyDir, name), []byte(c.Files[name]), 0o644); err != nil {
				return fmt.Errorf("%w: write %s: %w", ErrPolicy, name, err)
			}
		}
		return nil
	})
	if err != nil {
		a.emit(Event{Kind: "policy.apply", Actor: c.Actor, Outcome: "failed: " + err.Error()})
		return rep, err
	}
	a.dnsDecisionsChanged()
	rep.Applied = true
	out := "applied: " + rep.Summary
	if rep.Widens {
		out = "applied with --allow-widening: " + rep.Summary
	}
	a.emit(Event{Kind: "policy.apply", Actor: c.Actor, Outcome: out, Rule: strings.Join(names, ",")})
	return rep, a.recordApplied()
}

// appliedFile holds the last applied policy set (id -> Cedar text) in the
// state directory: what the restart check compares the disk with.
const appliedFile = "policy.applied.json"

func (a *Agent) recordApplied() error {
	set := map[string]string{}
	for id, p := range a.engine.Policies() {
		set[string(id)] = string(p.MarshalCedar())
	}
	data, err := json.Marshal(set)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(a.cfg.StateDir, appliedFile), data, 0o600)
}

func (a *Agent) lastApplied() (cedar.PolicyMap, bool, error) {
	data, err := os.ReadFile(filepath.Join(a.cfg.StateDir, appliedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrState, err)
	}
	var set map[string]string
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, false, fmt.Errorf("%w: %s: %w", ErrState, appliedFile, err)
	}
	out := cedar.PolicyMap{}
	for id, text := range set {
		var p cedar.Policy
		if err := p.UnmarshalCedar([]byte(text)); err != nil {
			return nil, false, fmt.Errorf("%w: %s: policy %s: %w", ErrState, appliedFile, id, err)
		}
		out[cedar.PolicyID(id)] = &p
	}
	return out, true, nil
}

// checkRestartPolicy compares the policy on disk (loaded by NewEngine) with
// the last applied set: an edit made while the agent was down goes through
// the same gate. A widening (or an unproven one) refuses the start unless
// Config.AcceptPolicyWidening, which is audited.
func (a *Agent) checkRestartPolicy() error {
	last, ok, err := a.lastApplied()
	if err != nil {
		return err
	}
	if ok {
		rep := a.engine.CheckShift(last, a.engine.Policies())
		if rep.Widens() {
			if !a.cfg.AcceptPolicyWidening {
				return fmt.Errorf("%w (the policy directory changed while the agent was down; start with -accept-policy-widening to accept it)", policy.WidensError(rep))
			}
			a.emit(Event{Kind: "policy.restart", Outcome: "accepted at start: " + rep.Summary()})
		} else if !rep.Proved || rep.Solver != "" {
			a.emit(Event{Kind: "policy.restart", Outcome: rep.Summary()})
		}
	}
	return a.recordApplied()
}
