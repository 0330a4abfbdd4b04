package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/agent/backend"
)

// auditState is the daemon's audit log and the denial aggregators that feed
// it: kernel denials (one record per session, reason, protocol and
// destination per second, with a count: the ring buffer may carry thousands a
// second) and use-time denials (POST /v1/decide: one record per session,
// class and rule per second, with a count; an enforcer may ask thousands of
// times a second, and a record of its own, with the log's fsync, would cost
// each denied answer milliseconds).
type auditState struct {
	log     *audit.Log
	mu      sync.Mutex
	pending map[denialKey]uint64
	decided map[decideKey]uint64
}

type denialKey struct {
	session, reason, proto, dst string
}

type decideKey struct {
	session, class, rule string
}

func (d *daemon) openAudit() error {
	l, err := audit.Open(audit.Config{Dir: d.cfg.StateDir, Logger: d.log})
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	d.audit = &auditState{log: l, pending: map[denialKey]uint64{}, decided: map[decideKey]uint64{}}
	if rec := l.Recovered(); rec != nil {
		auditErrors.WithLabelValues("recover").Inc()
		d.log.Warn("audit log: a torn tail was repaired at start", "recovery", fmt.Sprintf("%+v", *rec))
	}
	d.sink.audit = d.auditAgentEvent
	d.sink.kernelDenial = d.auditKernelDenial
	_, err = l.Append(audit.Event{Type: audit.EventAgentStart, Outcome: map[string]string{"true": "adopted", "false": "fresh"}[d.dp.Probe().Facts["adopted"]]})
	return err
}

func (d *daemon) closeAudit() {
	if d.audit == nil {
		return
	}
	d.flushDenials()
	d.audit.log.Append(audit.Event{Type: audit.EventAgentStop})
	d.audit.log.Close()
}

func (d *daemon) verifyAudit() (any, error) {
	if d.audit == nil {
		return nil, fmt.Errorf("no audit log")
	}
	rep, err := audit.Verify(d.audit.log.Path(), d.audit.log.PublicKey())
	if err != nil {
		return nil, auditErr("verify", err)
	}
	if !rep.OK() {
		auditErrors.WithLabelValues("verify").Inc()
		var probs []string
		for _, p := range rep.Problems {
			probs = append(probs, p.String())
		}
		return rep, fmt.Errorf("%d problem(s): %s", len(rep.Problems), strings.Join(probs, "; "))
	}
	return map[string]any{"records": rep.Records, "head": rep.Head, "notes": rep.Notes}, nil
}

// auditAgentEvent maps the agent's lifecycle events onto audit records. An
// error fails the step that emitted the event (fail closed).
func (d *daemon) auditAgentEvent(e agent.Event) error {
	if ev, ok := auditCall(e); ok {
		_, err := d.audit.log.Append(ev)
		return auditErr("append", err)
	}
	if e.Card != nil {
		return nil // other card notices: the approval events are the record
	}
	if e.Kind == agent.EventUseDenied {
		// A use-time denial: aggregated, written by flushDenials within a
		// second (the answer is a denial either way: nothing waits on the
		// record to be safe).
		k := decideKey{session: e.Session, class: string(e.Class), rule: e.Rule}
		d.audit.mu.Lock()
		d.audit.decided[k]++
		d.audit.mu.Unlock()
		return nil
	}
	ev := audit.Event{Time: e.Time, Session: e.Session, Resource: string(e.Class), Tier: e.Tier, Provenance: e.Provenance,
		Outcome: e.Outcome, RuleID: e.Rule, Human: e.Actor, Handle: e.Grant, Reason: e.Kind}
	if e.ParamsSHA256 != "" {
		// The agent hashed the parameters already; the log hashes what it is
		// given, so pass the hash (never the raw scope).
		ev.Params = []byte(e.ParamsSHA256)
	}
	switch {
	case e.Kind == agent.EventRun:
		// A process started in a session: the record the API wrote before
		// the agent was the one door (its argv hashed by the log).
		ev.Type, ev.Action, ev.Tool, ev.Reason = audit.EventDecision, "run", e.Tool, ""
		ev.Params, _ = json.Marshal(e.Args)
	case e.Kind == "session.create":
		ev.Type = audit.EventSessionCreate
	case e.Kind == "session.end":
		ev.Type = audit.EventSessionDelete
	case e.Kind == "grant.issue" || e.Kind == "grant.notify":
		ev.Type = audit.EventGrant
	case e.Kind == "grant.revoke":
		ev.Type = audit.EventRevoke
	case e.Kind == "approval.timeout":
		ev.Type = audit.EventTimeout
		ev.Outcome = "timed_out"
	case strings.HasPrefix(e.Kind, "approval."):
		ev.Type = audit.EventApproval
		ev.Card = e.Outcome
		ev.Outcome = strings.TrimPrefix(e.Kind, "approval.")
	default:
		ev.Type = audit.EventDecision
	}
	_, err := d.audit.log.Append(ev)
	return auditErr("append", err)
}

// auditCall maps the agent's records of the calls it was asked to make
// (requests, attenuations, card decisions, policy proposals) onto audit
// records, as the API wrote them before the agent was the one door.
func auditCall(e agent.Event) (audit.Event, bool) {
	ev := audit.Event{Time: e.Time, Human: e.Actor, AgentID: e.Requester, Session: e.Session, Resource: string(e.Class),
		Provenance: e.Provenance, Lifetime: e.Lifecycle, Parent: e.Parent, Params: e.Params}
	switch {
	case e.Kind == agent.EventRequest:
		ev.Type = audit.EventRequest
	case e.Kind == agent.EventAttenuate:
		ev.Type, ev.Outcome, ev.Handle = audit.EventAttenuate, e.Outcome, e.Grant
	case e.Kind == agent.EventPolicyPropose:
		ev.Type, ev.Action, ev.Outcome = audit.EventDecision, "policy.apply", e.Outcome
	case e.Card != nil && (e.Card.Status == agent.CardApproved || e.Card.Status == agent.CardDenied || e.Card.Status == agent.CardCancelled) &&
		e.Kind == "card."+e.Card.Status:
		// Who decided a card, and how.
		c := e.Card
		ev = audit.Event{Time: e.Time, Type: audit.EventApproval, Human: c.Decider, Session: c.Session, Card: c.ID, Tier: c.Tier.String(), Outcome: c.Status}
		if c.Status == agent.CardApproved {
			ev.Outcome = "approved_" + c.Decision
		}
	default:
		return audit.Event{}, false
	}
	return ev, true
}

func (d *daemon) auditKernelDenial(session string, ev backend.Event) {
	if d.audit == nil {
		return
	}
	k := denialKey{session: session, reason: ev.Reason.String(), proto: ev.Proto.String(), dst: ev.Dst.String()}
	d.audit.mu.Lock()
	d.audit.pending[k]++
	d.audit.mu.Unlock()
}

// flushDenials writes the aggregated kernel and use-time denials (called
// every second).
func (d *daemon) flushDenials() {
	if d.audit == nil {
		return
	}
	d.audit.mu.Lock()
	pending, decided := d.audit.pending, d.audit.decided
	d.audit.pending, d.audit.decided = map[denialKey]uint64{}, map[decideKey]uint64{}
	d.audit.mu.Unlock()
	if len(pending)+len(decided) == 0 {
		return
	}
	// One batch: one fsync and one checkpoint for the second's records.
	now := time.Now()
	evs := make([]audit.Event, 0, len(pending)+len(decided))
	for k, n := range pending {
		evs = append(evs, audit.Event{Type: audit.EventKernelDenial, Time: now, Session: k.session,
			Reason: k.reason, Resource: k.proto + " " + k.dst, Outcome: "denied", Count: n})
	}
	for k, n := range decided {
		evs = append(evs, audit.Event{Type: audit.EventDecision, Time: now, Session: k.session,
			Reason: agent.EventUseDenied, Resource: k.class, RuleID: k.rule, Outcome: "denied", Count: n})
	}
	if err := d.audit.log.AppendBatch(evs); auditErr("append", err) != nil {
		d.log.Error("audit denials", "err", err)
	}
}
