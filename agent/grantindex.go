package agent

// The grants of each session. The state keeps every grant record,
// tombstones included (Config.TombstoneRetention, a day by default), in one
// map; a grant's own work (the resolver policy of its session, at unlock)
// and a session's views need that session's grants only. grantIndex keeps
// them by session, beside st.Grants: a record is added where it enters
// st.Grants (issue) and removed where it leaves it (a failed intent, the
// sweep of old tombstones); Open builds it from the loaded state.

type grantIndex map[string]map[string]*GrantRecord // session → grant id → record

// newGrantIndex indexes grants.
func newGrantIndex(grants map[string]*GrantRecord) grantIndex {
	ix := grantIndex{}
	for _, g := range grants {
		ix.add(g)
	}
	return ix
}

func (ix grantIndex) add(g *GrantRecord) {
	m := ix[g.Session]
	if m == nil {
		m = map[string]*GrantRecord{}
		ix[g.Session] = m
	}
	m[g.ID] = g
}

func (ix grantIndex) remove(g *GrantRecord) {
	if m := ix[g.Session]; m != nil {
		delete(m, g.ID)
		if len(m) == 0 {
			delete(ix, g.Session)
		}
	}
}
