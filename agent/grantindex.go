package agent

// The grants of each session. The state keeps every grant record,
// tombstones included (Config.TombstoneRetention, a day by default), in one
// map; a grant's own work (the resolver policy of its session, at unlock)
// and a session's views need that session's grants only. grantIndex keeps
// them by session, beside st.Grants: a record is added where it enters
// st.Grants (issue) and removed where it leaves it (a failed intent, the
// sweep of old tombstones); Open builds it from the loaded state.
//
// The same shape keyed by parent grant id (newChildIndex) holds each
// grant's direct attenuations: a revoke finds its subtree from it
// (descendants) instead of sorting every grant the state keeps once per
// level, as it did.

type grantIndex map[string]map[string]*GrantRecord // session (or parent grant id) → grant id → record

// newGrantIndex indexes grants.
func newGrantIndex(grants map[string]*GrantRecord) grantIndex {
	ix := grantIndex{}
	for _, g := range grants {
		ix.add(g)
	}
	return ix
}

// newChildIndex indexes the attenuations among grants by their parent.
func newChildIndex(grants map[string]*GrantRecord) grantIndex {
	ix := grantIndex{}
	for _, g := range grants {
		if g.Parent != "" {
			ix.put(g.Parent, g)
		}
	}
	return ix
}

func (ix grantIndex) add(g *GrantRecord)    { ix.put(g.Session, g) }
func (ix grantIndex) remove(g *GrantRecord) { ix.drop(g.Session, g) }

func (ix grantIndex) put(key string, g *GrantRecord) {
	m := ix[key]
	if m == nil {
		m = map[string]*GrantRecord{}
		ix[key] = m
	}
	m[g.ID] = g
}

func (ix grantIndex) drop(key string, g *GrantRecord) {
	if m := ix[key]; m != nil {
		delete(m, g.ID)
		if len(m) == 0 {
			delete(ix, key)
		}
	}
}

// index adds g to the grant indexes (where it enters st.Grants).
func (a *Agent) index(g *GrantRecord) {
	a.bySession.add(g)
	if g.Parent != "" {
		a.children.put(g.Parent, g)
	}
	a.due.noteGrant(g)
}

// unindex removes g from the grant indexes (where it leaves st.Grants).
func (a *Agent) unindex(g *GrantRecord) {
	a.bySession.remove(g)
	if g.Parent != "" {
		a.children.drop(g.Parent, g)
	}
	delete(a.due.grants, g.ID)
}
