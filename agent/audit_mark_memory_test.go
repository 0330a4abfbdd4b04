package agent

// The mark a live record written beside its audit commit carries names the
// record (its seq and its hash), not just how far the log reached: on the
// memory backend with the real audit log and journal.

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/agent/store"
)

// TestGrantAuditLostAcrossFailedStarts: a power loss while both syncs ran
// keeps the second grant's live record and loses its audit batch; the
// restart that should demote it fails to write the demotion (the journal's
// write fails as a full disk would), so the start fails, but the daemon
// has appended its agent.start record durably before the agent opened.
// After enough such starts the log's head reaches and passes the lost
// grant's mark, with other records at those seqs. The start that finally
// succeeds still finds the grant's grant.issue record missing (the record
// at its mark is not the one it names) and rolls it back: the log never
// shows fewer live grants than the journal keeps.
func TestGrantAuditLostAcrossFailedStarts(t *testing.T) {
	dir := t.TempDir()
	sink := newAuditSink(t, dir)
	failing := false
	full := fmt.Errorf("journal: %w", syscall.ENOSPC)
	m := newMemoryAgent(t, func(c *Config) {
		c.Events = sink
		c.StoreFault = func(op string) error {
			if failing && op == store.FaultJournalWrite {
				return full
			}
			return nil
		}
	})
	m.session(t, "s1")
	const kept, lost = "127.0.0.2:8080", "127.0.0.3:8080"
	g1, g2, logPath, mark := grantThenLoseBatch(t, m, sink, kept, lost)

	// Starts whose demotion cannot be written: each fails, and each leaves
	// the daemon's agent.start record durable in the log.
	failed := 0
	for {
		*sink = *newAuditSink(t, dir)
		if sink.log.OpenedHead() > mark {
			break
		}
		if _, err := sink.log.Append(audit.Event{Type: audit.EventAgentStart}); err != nil {
			t.Fatal(err)
		}
		failing = true
		a, err := m.open(t)
		failing = false
		if err == nil {
			a.Close()
			t.Fatalf("start %d with the journal full and a live grant whose audit records were lost: no error", failed+1)
		}
		if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "lost") {
			t.Fatalf("start %d: %v, want the demotion's write failing with ENOSPC", failed+1, err)
		}
		sink.log.Close()
		if failed++; failed > 10 {
			t.Fatal("the log's head does not move past the mark")
		}
	}
	if head, _ := sink.log.Head(); head <= mark || failed < 2 {
		t.Fatalf("after %d failed starts the log is at %d, the lost mark %d: the case is not the reported one", failed, head, mark)
	}
	if _, err := sink.log.Append(audit.Event{Type: audit.EventAgentStart}); err != nil {
		t.Fatal(err)
	}
	m.reopen(t)
	wantLostRolledBack(t, m, sink, g1, g2, logPath, kept, lost, fmt.Sprintf("after %d failed starts moved the log past its mark", failed))
	m.reopen(t)
	if p := grantPhase(t, m, g2.ID); p != PhaseRolledBack {
		t.Fatalf("after another restart the lost grant is %s", p)
	}
	m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(lost)})
	m.wantAllowed(t, "s1", kept, lost)
	sink.verified(t)
}
