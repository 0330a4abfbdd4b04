package agent

// What the periodic sweep (Sweep, lifecycle.go) may have to act on. The
// state keeps every session and grant record; at 10,000 sessions a pass
// over all of them each second held the agent's lock for milliseconds, and
// grants waited behind it. dueIndex keeps, beside the state, the ids of the
// records that can become due without passing through one of the places
// that note them again:
//   - a session whose spec has an expiry (set at create, never changed);
//   - a grant with an expiry (fixed before it enters st.Grants), one whose
//     teardown is to be retried (PhaseRevoking) and a tombstone (its
//     retention runs out).
//
// It is a superset: a record is noted where it enters the state (create,
// issue, a removal undone) and where a grant's phase moves to revoking or
// ended (revoke, rollback); Open builds it from the loaded state. The
// sweep drops an id whose record is gone or can no longer become due, so
// nothing is removed anywhere else. An id missing from it would be a
// record the sweep never sees: TestSweepFindsEveryDue covers each way in.

import "github.com/shinken-agent/shinken/agent/store"

type dueIndex struct {
	sessions map[string]struct{} // under mu
	grants   map[string]struct{} // under mu
}

func newDueIndex(st *store.State) dueIndex {
	ix := dueIndex{sessions: map[string]struct{}{}, grants: map[string]struct{}{}}
	for id, rec := range st.Sessions {
		ix.noteSession(id, rec)
	}
	for _, g := range st.Grants {
		ix.noteGrant(g)
	}
	return ix
}

// sessionMayBeDue: the session can expire.
func sessionMayBeDue(rec *SessionRecord) bool { return !rec.Spec.Expires.IsZero() }

// grantMayBeDue: the grant can expire, its teardown is to be retried, or
// it is a tombstone.
func grantMayBeDue(g *GrantRecord) bool {
	return !g.Expires.IsZero() || g.Phase == PhaseRevoking || g.Phase.Terminal()
}

func (ix dueIndex) noteSession(id string, rec *SessionRecord) {
	if sessionMayBeDue(rec) {
		ix.sessions[id] = struct{}{}
	}
}

func (ix dueIndex) noteGrant(g *GrantRecord) {
	if grantMayBeDue(g) {
		ix.grants[g.ID] = struct{}{}
	}
}
