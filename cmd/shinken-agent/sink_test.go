package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
	"github.com/shinken-agent/shinken/agent/audit"
)

// TestSinkDefersAndCommits: the daemon's sink writes a deferred event's
// record without its sync (the checkpoint stays behind), and Commit makes
// the batch durable and checkpointed and runs the agent's work once;
// then's failure is Commit's, and it is not counted as the log's.
func TestSinkDefersAndCommits(t *testing.T) {
	dir := t.TempDir()
	l, err := audit.Open(audit.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := &daemon{hub: api.NewHub(16), audit: &auditState{log: l, den: audit.NewDenials(audit.DenialsConfig{})}}
	d.sink = &eventSink{hub: d.hub, audit: d.auditAgentEvent, commit: d.commitAudit}
	var _ agent.Committer = d.sink

	verify := func() *audit.Report {
		t.Helper()
		rep, err := audit.Verify(filepath.Join(dir, audit.LogFile), l.PublicKey())
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if err := d.sink.Emit(agent.Event{Kind: agent.EventRequest, Session: "s1", Class: agent.ClassNetEgress, Params: []byte(`{}`), Defer: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.sink.Emit(agent.Event{Kind: "grant.issue", Session: "s1", Grant: "g1", Outcome: "live", Defer: true}); err != nil {
		t.Fatal(err)
	}
	head, _ := l.Head()
	if rep := verify(); rep.Head != head || len(rep.Notes) != 1 {
		t.Fatalf("after two deferred events: verified head %d of %d, notes %v: want the checkpoint noted behind", rep.Head, head, rep.Notes)
	}
	ran := 0
	if err := d.sink.Commit(func() error { ran++; return nil }); err != nil || ran != 1 {
		t.Fatalf("commit: %v, then ran %d times", err, ran)
	}
	if err := l.Checkpointed(); err != nil { // the checkpoint trails the commit
		t.Fatal(err)
	}
	if rep := verify(); rep.Head != head || len(rep.Notes) != 0 {
		t.Fatalf("after the commit: verified head %d of %d, notes %v", rep.Head, head, rep.Notes)
	}
	before := counterValue(t, "append")
	boom := errors.New("journal: no space left on device")
	if err := d.sink.Commit(func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("commit with then failing: %v", err)
	}
	if got := counterValue(t, "append"); got != before {
		t.Fatalf("the journal's failure counted as the audit log's (%v -> %v)", before, got)
	}
}

func counterValue(t *testing.T, op string) float64 {
	t.Helper()
	return testutil.ToFloat64(auditErrors.WithLabelValues(op))
}

// TestSinkCommitBeside: the daemon's sink runs the agent's journal write
// beside the log's sync with the batch's last seq, leaves the log
// checkpointed once the checkpoint has caught up, says how far a mark is known kept (Durable), and counts a
// failure as the log's only when the log failed.
func TestSinkCommitBeside(t *testing.T) {
	dir := t.TempDir()
	l, err := audit.Open(audit.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := &daemon{hub: api.NewHub(16), audit: &auditState{log: l, den: audit.NewDenials(audit.DenialsConfig{})}}
	d.sink = &eventSink{hub: d.hub, audit: d.auditAgentEvent, commit: d.commitAudit, commitBeside: d.commitAuditBeside, recordHash: l.RecordHash}
	var _ agent.BesideCommitter = d.sink
	if held, attached, err := (&eventSink{}).HasRecord(1, "x"); held || attached || err != nil {
		t.Fatalf("a sink with no audit log: held %v attached %v %v", held, attached, err)
	}
	if err := d.sink.Emit(agent.Event{Kind: "grant.issue", Session: "s1", Grant: "g1", Outcome: "live", Defer: true}); err != nil {
		t.Fatal(err)
	}
	head, headHash := l.Head()
	var mark uint64
	var markHash string
	if err := d.sink.CommitBeside(func(m uint64, h string) error { mark, markHash = m, h; return nil }); err != nil || mark != head || markHash != headHash {
		t.Fatalf("CommitBeside: %v, mark %d %s, want the head %d %s", err, mark, markHash, head, headHash)
	}
	if held, attached, err := d.sink.HasRecord(mark, markHash); !held || !attached || err != nil {
		t.Fatalf("HasRecord of the mark just committed: held %v attached %v %v", held, attached, err)
	}
	if held, _, err := d.sink.HasRecord(mark, strings.Repeat("0", len(markHash))); held || err != nil {
		t.Fatalf("HasRecord of the mark's seq with another hash: held %v %v", held, err)
	}
	if held, _, err := d.sink.HasRecord(mark+1, markHash); held || err != nil {
		t.Fatalf("HasRecord past the head: held %v %v", held, err)
	}
	if err := l.Checkpointed(); err != nil { // the checkpoint trails the commit
		t.Fatal(err)
	}
	rep, err := audit.Verify(filepath.Join(dir, audit.LogFile), l.PublicKey())
	if err != nil || rep.Head != head || len(rep.Notes) != 0 {
		t.Fatalf("after CommitBeside: %v, verified head %d of %d, notes %v", err, rep.Head, head, rep.Notes)
	}
	before := counterValue(t, "append")
	boom := errors.New("journal: no space left on device")
	if err := d.sink.CommitBeside(func(uint64, string) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("CommitBeside with then failing: %v", err)
	}
	if got := counterValue(t, "append"); got != before {
		t.Fatalf("the journal's failure counted as the audit log's (%v -> %v)", before, got)
	}
}
