package agent

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/store"
)

// checkAuditMarks runs at start, before reconcile: a grant whose live
// record was written beside its audit commit (BesideCommitter, the
// record's AuditMark) is live only if the audit log kept that commit. One
// whose mark is beyond the highest mark the sink knows kept (Durable: the
// head the audit log was opened at, or a later commit of its own) lost
// its records (a power loss while the journal's fsync and the log's
// fdatasync ran together, or a failed fdatasync whose rollback could not
// be written; a kill -9 keeps both in the page cache) and was never
// answered, since the answer waits for both syncs: it goes back to
// applying, synced before anything else is done, and reconcile rolls it
// back (revoking its handle and releasing its Delta, recording
// grant.rollback). A failed write fails the start and changes nothing.
func (a *Agent) checkAuditMarks() error {
	c, ok := a.cfg.Events.(BesideCommitter)
	if !ok {
		return nil
	}
	durable, ok := c.Durable()
	if !ok {
		return nil
	}
	a.mu.Lock()
	defer a.unlock()
	var demoted []*GrantRecord
	for _, g := range a.st.Grants {
		if g.Phase == PhaseLive && g.AuditMark > durable {
			demoted = append(demoted, g)
		}
	}
	if len(demoted) == 0 {
		return nil
	}
	keys := make([]string, len(demoted))
	for i, g := range demoted {
		g.Phase = PhaseApplying
		keys[i] = store.GrantKey(g.ID)
	}
	if err := a.persistKeys(keys...); err != nil {
		for _, g := range demoted {
			g.Phase = PhaseLive
		}
		return fmt.Errorf("agent: %d live grants whose audit records the log lost (past seq %d): mark them not live: %w", len(demoted), durable, err)
	}
	for _, g := range demoted {
		a.cfg.Logger.Warn("grant written live beside an audit commit the log lost: rolled back as never live",
			"grant", g.ID, "session", g.Session, "audit_mark", g.AuditMark, "audit_durable", durable)
	}
	return nil
}
