package agent

// Read-only views of the grants, for the API and metrics.

import (
	"github.com/shinken-agent/shinken/agent/backend"
)

// Grants lists the session's grants ("" for all), tombstones included.
func (a *Agent) Grants(session string) []GrantInfo {
	a.mu.Lock()
	defer a.unlock()
	var out []GrantInfo
	gs := a.sortedOf(session) // its own grants, not every grant kept
	if session == "" {
		gs = a.sortedGrants()
	}
	for _, g := range gs {
		gi := GrantInfo{ID: g.ID, Session: g.Session, Capability: g.Capability, Tier: g.Tier, Provenance: g.Provenance,
			Lifecycle: g.Lifecycle, Expires: g.Expires, Parent: g.Parent, Phase: g.Phase, Kernel: g.Kernel}
		for _, e := range g.Delta.Files {
			if e.Override {
				gi.Overrides = append(gi.Overrides, e.Path)
			}
		}
		if g.Lifecycle == LifecycleOnce && g.Phase == PhaseLive {
			st, err := a.kernel.HandleState(g.Kernel)
			gi.Consumed = err == nil && st == backend.HandleUsed
		}
		out = append(out, gi)
	}
	return out
}
