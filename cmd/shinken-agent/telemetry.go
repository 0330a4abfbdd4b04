package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/agent/backend"
)

// auditState is the daemon's audit log and the denial aggregator that feeds
// it (audit.Denials): kernel denials (the ring buffer may carry hundreds of
// thousands a second) and use-time denials (POST /v1/decide: an enforcer may
// ask thousands of times a second, and a record of its own, with the log's
// fsync, would cost each denied answer milliseconds) become per second one
// counted record per session, reason and destination prefix (or class and
// rule), within a per-session ceiling of bytes a minute past which records
// are held back and counted in an audit_suppressed record.
type auditState struct {
	log  *audit.Log
	den  *audit.Denials
	vmu  sync.Mutex
	mark audit.Mark // where the last verification that passed ended
	sup  suppressedSeen
}

func (d *daemon) openAudit() error {
	l, err := audit.Open(audit.Config{Dir: d.cfg.StateDir, Logger: d.log})
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	d.audit = &auditState{log: l, den: audit.NewDenials(audit.DenialsConfig{BytesPerMinute: d.cfg.AuditDenialBytesPerMinute})}
	if rec := l.Recovered(); rec != nil {
		auditErrors.WithLabelValues("recover").Inc()
		d.log.Warn("audit log: a torn tail was repaired at start", "recovery", fmt.Sprintf("%+v", *rec))
	}
	d.sink.audit = d.auditAgentEvent
	d.sink.kernelDenial = d.auditKernelDenial
	d.sink.commit = d.commitAudit
	d.sink.commitBeside = d.commitAuditBeside
	d.sink.recordHash = l.RecordHash
	d.addSuppressed() // the baseline: what was suppressed before this daemon
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

// verifyAudit verifies the audit log: in full, or (full false) only what
// was appended since the last verification that passed (audit.VerifyFrom
// from its mark; the first one of the daemon's life is full).
func (d *daemon) verifyAudit(full bool) (any, error) {
	if d.audit == nil {
		return nil, fmt.Errorf("no audit log")
	}
	d.audit.vmu.Lock()
	defer d.audit.vmu.Unlock()
	from := d.audit.mark
	if full {
		from = audit.Mark{}
	}
	// The checkpoint trails the log's syncs: let it cover every record
	// acknowledged so far, so the report has no note about a checkpoint
	// merely still being written. An error here is the log's failure.
	if err := d.audit.log.Checkpointed(); err != nil {
		return nil, auditErr("verify", err)
	}
	rep, err := audit.VerifyFrom(d.audit.log.Path(), d.audit.log.PublicKey(), from)
	if err != nil && rep == nil {
		return nil, auditErr("verify", err)
	}
	if !rep.OK() {
		auditErrors.WithLabelValues("verify").Inc()
		d.audit.mark = audit.Mark{} // the next one is full
		var probs []string
		for _, p := range rep.Problems {
			probs = append(probs, p.String())
		}
		return rep, fmt.Errorf("%d problem(s): %s", len(rep.Problems), strings.Join(probs, "; "))
	}
	d.audit.mark = rep.Mark
	return map[string]any{"records": rep.Records, "head": rep.Head, "notes": rep.Notes, "full": from == audit.Mark{}}, nil
}

// auditAgentEvent maps the agent's lifecycle events onto audit records. An
// error fails the step that emitted the event (fail closed).
func (d *daemon) auditAgentEvent(e agent.Event) error {
	if ev, ok := auditCall(e); ok {
		return d.auditAppend(ev, e.Defer)
	}
	if e.Card != nil {
		return nil // other card notices: the approval events are the record
	}
	if e.Kind == agent.EventUseDenied {
		// A use-time denial: aggregated, written by flushDenials within a
		// second (the answer is a denial either way: nothing waits on the
		// record to be safe).
		d.audit.den.Add(audit.Denial{Session: e.Session, Type: audit.EventDecision, Reason: agent.EventUseDenied, Proto: string(e.Class), RuleID: e.Rule})
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
	case e.Kind == agent.EventFilePut || e.Kind == agent.EventFileGet:
		ev.Type, ev.Action, ev.Reason = audit.EventDecision, e.Kind, fileReason(e.Detail)
		ev.Resource = fileResource(e.Detail)
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
	return d.auditAppend(ev, e.Defer)
}

// commitAudit makes the records of deferred events durable, then runs then
// (the agent's journal write); their checkpoint follows (audit.Log.Commit,
// agent.Committer).
func (d *daemon) commitAudit(then func() error) error {
	var thenErr error
	wrapped := then
	if then != nil {
		wrapped = func() error { thenErr = then(); return thenErr }
	}
	err := d.audit.log.Commit(wrapped)
	if err != nil && err != thenErr {
		// The log's own failure, not then's (the journal's): records
		// that could not be made durable count as a failed append.
		auditErrors.WithLabelValues("append").Inc()
	}
	return err
}

// commitAuditBeside is commitAudit with then (the agent's journal write
// of a live grant) run beside the log's fdatasync, given the batch's last
// seq and hash (audit.Log.CommitBeside, agent.BesideCommitter).
func (d *daemon) commitAuditBeside(then func(uint64, string) error) error {
	err := d.audit.log.CommitBeside(then)
	if errors.Is(err, audit.ErrFailed) {
		// The log's own failure (the journal's errors are not ErrFailed):
		// records that could not be made durable count as a failed append.
		auditErrors.WithLabelValues("append").Inc()
	}
	return err
}

// auditAppend appends ev: durably, or (deferred) written only, for the
// agent's next Commit to make durable with the records after it.
func (d *daemon) auditAppend(ev audit.Event, deferred bool) error {
	if deferred {
		_, err := d.audit.log.Write(ev)
		return auditErr("append", err)
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
	x := audit.Denial{Session: session, Type: audit.EventKernelDenial, Class: string(ev.Reason.Class()), Reason: ev.Reason.String(), Proto: ev.Proto.String(), Dst: ev.Dst}
	switch ev.Reason.Class() {
	case backend.ClassProcess, backend.ClassFSScope:
		// A file, not a destination: its path (process) and dev:inode.
		x.Proto, x.Object = "", denialObject(ev)
	}
	d.audit.den.Add(x)
}

// denialObject names the file a kernel denial refused: "exec PATH
// (dev D ino I)" for an exec, "access A dev D ino I" for fs.scope.
func denialObject(ev backend.Event) string {
	id := fmt.Sprintf("dev %d:%d ino %d", ev.Dev>>20, ev.Dev&(1<<20-1), ev.Inode)
	if ev.Reason.Class() == backend.ClassProcess {
		if ev.Path != "" {
			return fmt.Sprintf("exec %s (%s)", ev.Path, id)
		}
		return "exec " + id
	}
	return fmt.Sprintf("access %d %s", ev.Access, id)
}

// flushDenials writes the second's aggregated kernel and use-time denials
// (called every second): one batch, one fsync and one checkpoint.
func (d *daemon) flushDenials() {
	if d.audit == nil {
		return
	}
	d.addSuppressed()
	evs := d.audit.den.Flush(time.Now())
	if len(evs) == 0 {
		return
	}
	if err := d.audit.log.AppendBatch(evs); auditErr("append", err) != nil {
		d.log.Error("audit denials", "err", err)
	}
}

// fileResource and fileReason put a file transfer's path, size and hash
// into its audit record.
func fileResource(d any) string {
	t, _ := d.(agent.FileTransfer)
	return t.Path
}

func fileReason(d any) string {
	t, _ := d.(agent.FileTransfer)
	if t.Error != "" {
		return fmt.Sprintf("%d bytes: %s", t.Bytes, t.Error)
	}
	return fmt.Sprintf("%d bytes, sha256 %s", t.Bytes, t.SHA256)
}
