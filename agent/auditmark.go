package agent

import (
	"fmt"
	"sort"

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
//
// One lookup vouches for every lower mark: a record's hash covers its
// prev_hash, so the record the log holds at the highest matching mark
// fixes every record before it. Every live grant's mark lies on one chain:
// each successful start checked the marks live then against the log it
// continues, and a grant made since was written on that log. So the
// lookups go from the highest mark down and stop at the first the log
// holds; a start reads the log back to the newest live grant's record
// once, not once per grant.
func (a *Agent) checkAuditMarks() error {
	c, ok := a.cfg.Events.(BesideCommitter)
	if !ok {
		return nil
	}
	a.mu.Lock()
	defer a.unlock()
	var marked []*GrantRecord
	for _, g := range a.st.Grants {
		if g.Phase == PhaseLive && g.AuditMark != 0 {
			marked = append(marked, g)
		}
	}
	// Highest mark first: the first record the log holds vouches for every
	// lower mark (see the comment above), so the lookups stop there.
	sort.Slice(marked, func(i, j int) bool { return marked[i].AuditMark > marked[j].AuditMark })
	var demoted []*GrantRecord
	for i, g := range marked {
		held, attached, err := c.HasRecord(g.AuditMark, g.AuditHash)
		if err != nil {
			return fmt.Errorf("agent: grant %s: look up its audit record (seq %d): %w", g.ID, g.AuditMark, err)
		}
		if !attached {
			return nil
		}
		if held && g.AuditHash != "" {
			for _, lower := range marked[i+1:] {
				if lower.AuditHash == "" {
					demoted = append(demoted, lower)
				}
			}
			break
		}
		demoted = append(demoted, g)
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
