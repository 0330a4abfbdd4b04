package agent

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/store"
)

// checkAuditMarks runs at start, before reconcile: a grant whose live
// record was written beside its audit commit (BesideCommitter, the
// record's AuditMark and AuditHash) is live only if the audit log holds
// that very record: the record at the mark's seq, with the mark's hash.
// One whose record the log does not hold lost its records (a power loss
// while the journal's fsync and the log's fdatasync ran together, or a
// failed fdatasync whose rollback could not be written; a kill -9 keeps
// both in the page cache) and was never answered, since the answer waits
// for both syncs. The seq alone would not do: the log gives a lost
// record's seq to the next record it writes, and a start that fails after
// the daemon appended its own records leaves the log further on, so only
// the hash tells the lost record from the one now at its seq, however far
// the log has got. Such a grant goes back to applying, synced before
// anything else is done, and reconcile rolls it back (revoking its handle
// and releasing its Delta, recording grant.rollback). A failed write, or
// a log that cannot be read at the mark, fails the start and changes
// nothing; the next start checks again.
func (a *Agent) checkAuditMarks() error {
	c, ok := a.cfg.Events.(BesideCommitter)
	if !ok {
		return nil
	}
	a.mu.Lock()
	defer a.unlock()
	var demoted []*GrantRecord
	for _, g := range a.st.Grants {
		if g.Phase != PhaseLive || g.AuditMark == 0 {
			continue
		}
		held, attached, err := c.HasRecord(g.AuditMark, g.AuditHash)
		if err != nil {
			return fmt.Errorf("agent: grant %s: look up its audit record (seq %d): %w", g.ID, g.AuditMark, err)
		}
		if !attached {
			return nil
		}
		if !held || g.AuditHash == "" {
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
		return fmt.Errorf("agent: %d live grants whose audit records the log lost: mark them not live: %w", len(demoted), err)
	}
	for _, g := range demoted {
		a.cfg.Logger.Warn("grant written live beside an audit record the log does not hold: rolled back as never live",
			"grant", g.ID, "session", g.Session, "audit_mark", g.AuditMark, "audit_hash", g.AuditHash)
	}
	return nil
}
