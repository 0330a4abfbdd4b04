package agent

// A grant's live record written beside its audit commit (BesideCommitter),
// on the memory backend with a real audit log: the one case the order of
// the two syncs used to rule out (the journal's live record kept, the
// audit records lost) is repaired at the next start, a log whose sync
// fails after the journal's write fails the grant and leaves nothing live,
// and a crash at every step of GRANT leaves state, backend and audit log
// agreeing.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/shinken-agent/shinken/agent/audit"
)

// auditHas reports whether the audit log at path holds a record for grant
// id of kind (the test sink's records carry the kind as their reason).
func auditHas(t testing.TB, path, id, kind string) bool {
	t.Helper()
	for _, ln := range bytes.Split(mustRead(t, path), []byte("\n")) {
		if bytes.Contains(ln, []byte(id)) && bytes.Contains(ln, []byte(`"`+kind+`"`)) {
			return true
		}
	}
	return false
}

// grantPhase is the phase of grant id, as a restarted agent sees it.
func grantPhase(t testing.TB, m *memoryAgent, id string) GrantPhase {
	t.Helper()
	return m.info(t, id).Phase
}

// TestGrantAuditBatchLost: what a power loss while the journal's fsync and
// the log's fdatasync both ran can leave: the journal keeps the second
// grant's live record, the audit log loses the batch of its request and
// grant.issue (the log cut back to after the first grant, its checkpoint
// as it was then, since a checkpoint slot is written only after the log's
// fdatasync). The restarted agent does not take the second grant as live:
// reconcile rolls it back (nothing left in the backend, grant.rollback in
// the log), the first grant, whose records the log kept, stays live, and
// the same request succeeds again.
func TestGrantAuditBatchLost(t *testing.T) {
	dir := t.TempDir()
	sink := newAuditSink(t, dir)
	m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
	m.session(t, "s1")
	const kept, lost = "127.0.0.2:8080", "127.0.0.3:8080"
	g1, g2, logPath, _ := grantThenLoseBatch(t, m, sink, kept, lost)
	if n := liveInJournal(t, m.dir); n != 2 {
		t.Fatalf("%d live records in the journal before the restart, want both grants'", n)
	}
	*sink = *newAuditSink(t, dir)
	m.reopen(t)
	if sink.lookups != 2 {
		t.Fatalf("the start looked up %d audit records, want 2 (the lost grant's, then the kept one's, which vouches for the rest)", sink.lookups)
	}

	wantLostRolledBack(t, m, sink, g1, g2, logPath, kept, lost, "after the restart")
	m.converged(t, memCrashAt{step: "restart"})
	m.reopen(t) // and it stays so
	if p := grantPhase(t, m, g2.ID); p != PhaseRolledBack {
		t.Fatalf("after a second restart the lost grant is %s", p)
	}
	m.wantAllowed(t, "s1", kept)
	m.wantDenied(t, "s1", lost)
	m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(lost)})
	m.wantAllowed(t, "s1", kept, lost)
	sink.verified(t)
}

// TestGrantAuditSyncFailsBeside: the log's fdatasync fails after the
// journal's live record was written and synced beside it: the grant is
// refused with the log's error, rolled back (no live handle, no rule; the
// journal ends with the grant rolled back, so a restart finds it so), and
// the same request succeeds once the log works.
func TestGrantAuditSyncFailsBeside(t *testing.T) {
	sink := newAuditSink(t, t.TempDir())
	m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
	m.session(t, "s1")
	boom := errors.New("audit: sync: input/output error")
	sink.failAfter = boom
	ran := 0
	sink.inThen = func() { ran++ }
	res, err := m.Request(ctx, []GrantRequest{{Session: "s1", Lifecycle: LifecycleSession, Capability: loopEgress("127.0.0.2:8080")}})
	if res == nil || res[0].Outcome != "denied" || !errors.Is(res[0].Err, boom) {
		t.Fatalf("request with the log's sync failing: %v %+v, want denied with its error", err, res)
	}
	if ran != 1 || liveInJournal(t, m.dir) != 1 {
		t.Fatalf("the journal's write ran %d times, %d live lines: the failure must come after it", ran, liveInJournal(t, m.dir))
	}
	if n := len(m.liveHandles(t)); n != 0 {
		t.Fatalf("%d live handles after the failed sync", n)
	}
	m.wantDenied(t, "s1", "127.0.0.2:8080")
	gs := m.Grants("s1")
	if len(gs) != 1 || gs[0].Phase != PhaseRolledBack {
		t.Fatalf("grants after the failed sync: %+v, want one rolled back", gs)
	}
	sink.failAfter, sink.inThen = nil, nil
	m.reopen(t)
	if p := grantPhase(t, m, gs[0].ID); p != PhaseRolledBack {
		t.Fatalf("after a restart the failed grant is %s", p)
	}
	m.checkAgree(t, "s1", 1)
	m.wantDenied(t, "s1", "127.0.0.2:8080")
	m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress("127.0.0.2:8080")})
	m.wantAllowed(t, "s1", "127.0.0.2:8080")
	sink.verified(t)
}

// TestMemoryCrashGrantAudit is TestMemoryCrashGrant with the audit log as
// the sink (the live record written beside the commit): after a crash at
// any step and a restart, state and backend agree, and every live grant's
// grant.issue record is in the log, within what it has made durable.
func TestMemoryCrashGrantAudit(t *testing.T) {
	const x, y = "127.0.0.2:8080", "127.0.0.3:8081"
	for _, s := range GrantSteps {
		at := memCrashAt{step: s}
		t.Run(at.String(), func(t *testing.T) {
			sink := newAuditSink(t, t.TempDir())
			m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
			m.session(t, "s1")
			m.crash(t, at, func(a *Agent) error {
				_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: crashCap(x, y), Lifecycle: LifecycleSession})
				return err
			})
			m.reopen(t)
			wantLive := at.step == StepGrantLive || at.step == StepGrantEmitted
			n := m.checkAgree(t, "s1", 4)
			if (n == 1) != wantLive || n > 1 {
				t.Fatalf("after a crash at %s: %d live grants, want live=%v", at, n, wantLive)
			}
			for _, g := range m.Grants("s1") {
				if g.Phase != PhaseLive {
					continue
				}
				if !auditHas(t, sink.log.Path(), g.ID, "grant.issue") {
					t.Fatalf("live grant %s has no grant.issue record in the log", g.ID[:8])
				}
				rec := m.st.Grants[g.ID]
				if held, _, err := sink.HasRecord(rec.AuditMark, rec.AuditHash); rec.AuditMark == 0 || !held || err != nil {
					t.Fatalf("live grant %s: audit mark %d %s not held by the log (%v)", g.ID[:8], rec.AuditMark, rec.AuditHash, err)
				}
			}
			if wantLive {
				m.wantAllowed(t, "s1", x, y)
			} else {
				m.wantDenied(t, "s1", x, y)
			}
			m.converged(t, at)
			m.grant(t, GrantRequest{Session: "s1", Capability: crashCap(x, y)})
			m.wantAllowed(t, "s1", x, y)
		})
	}
}

// TestAuditMarksOneLookup: a start with many live grants whose records the
// log holds reads one record back (the newest grant's): its hash fixes
// every record before it, so every lower mark is vouched for.
func TestAuditMarksOneLookup(t *testing.T) {
	dir := t.TempDir()
	sink := newAuditSink(t, dir)
	m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
	m.session(t, "s1")
	var addrs []string
	for i := 2; i < 12; i++ {
		a := fmt.Sprintf("127.0.0.%d:8080", i)
		m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(a)})
		addrs = append(addrs, a)
	}
	if err := m.Agent.Close(); err != nil {
		t.Fatal(err)
	}
	m.Agent = nil
	sink.log.Close()
	*sink = *newAuditSink(t, dir)
	m.reopen(t)
	if sink.lookups != 1 {
		t.Fatalf("the start looked up %d audit records for 10 live grants, want 1", sink.lookups)
	}
	if n := m.checkAgree(t, "s1", 1); n != 10 {
		t.Fatalf("%d live grants after the restart, want 10", n)
	}
	m.wantAllowed(t, "s1", addrs...)
}

// grantThenLoseBatch grants kept then lost in session s1 (both allowed),
// then simulates a power loss that the journal's fsync and the log's
// fdatasync running together can leave: the agent and the log stop, the
// log is cut back to after the first grant and its checkpoint restored as
// it was then (a checkpoint slot is written only after the log's
// fdatasync), while the journal keeps both live records. It returns the
// two grants, the log's path and the second grant's audit mark.
func grantThenLoseBatch(t *testing.T, m *memoryAgent, sink *auditSink, kept, lost string) (g1, g2 *Grant, logPath string, mark uint64) {
	t.Helper()
	g1 = m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(kept)})
	logPath = sink.log.Path()
	cpPath := audit.CheckpointPath(logPath)
	st, err := os.Stat(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.log.Checkpointed(); err != nil { // the checkpoint as it was then
		t.Fatal(err)
	}
	oldCP := mustRead(t, cpPath)
	g2 = m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(lost)})
	if mark = m.st.Grants[g2.ID].AuditMark; mark <= m.st.Grants[g1.ID].AuditMark {
		t.Fatalf("audit marks %d then %d: want the second beyond the first", m.st.Grants[g1.ID].AuditMark, mark)
	}
	m.wantAllowed(t, "s1", kept, lost)
	if err := m.Agent.Close(); err != nil {
		t.Fatal(err)
	}
	m.Agent = nil
	sink.log.Close()
	if err := os.Truncate(logPath, st.Size()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cpPath, oldCP, 0o600); err != nil {
		t.Fatal(err)
	}
	if auditHas(t, logPath, g2.ID, "grant.issue") || !auditHas(t, logPath, g1.ID, "grant.issue") {
		t.Fatal("the simulated loss did not cut exactly the second grant's batch")
	}
	return g1, g2, logPath, mark
}

// wantLostRolledBack: after the restart that followed grantThenLoseBatch,
// the grant whose audit records were lost (g2) is rolled back with a
// grant.rollback record, the one whose records the log kept (g1) is live
// and alone, the backend agrees, and the log verifies.
func wantLostRolledBack(t *testing.T, m *memoryAgent, sink *auditSink, g1, g2 *Grant, logPath, kept, lost, when string) {
	t.Helper()
	if p := grantPhase(t, m, g2.ID); p != PhaseRolledBack {
		t.Fatalf("the grant whose audit records were lost is %s %s, want %s", p, when, PhaseRolledBack)
	}
	if p := grantPhase(t, m, g1.ID); p != PhaseLive {
		t.Fatalf("the grant whose records the log kept is %s %s, want live", p, when)
	}
	if n := m.checkAgree(t, "s1", 1); n != 1 {
		t.Fatalf("%d live grants %s, want 1", n, when)
	}
	m.wantAllowed(t, "s1", kept)
	m.wantDenied(t, "s1", lost)
	if !auditHas(t, logPath, g2.ID, "grant.rollback") {
		t.Fatal("no grant.rollback record for the grant rolled back at start")
	}
	sink.verified(t)
}
