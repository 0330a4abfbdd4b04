package agent

// Read-only views of the grants, for the API and metrics.

import (
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// GrantInfo is a read-only view of one grant.
type GrantInfo struct {
	ID         string            `json:"id"`
	Session    string            `json:"session"`
	Capability Capability        `json:"capability"`
	Tier       Tier              `json:"tier"`
	Provenance Provenance        `json:"provenance"`
	Lifecycle  Lifecycle         `json:"lifecycle"`
	Expires    time.Time         `json:"expires,omitzero"`
	Parent     string            `json:"parent,omitempty"`
	Phase      GrantPhase        `json:"phase"`
	Kernel     backend.HandleRef `json:"kernel"`
	// Consumed: a live approve-once grant whose one use the kernel has
	// spent (its first allowed connect or send); the flow it opened lives
	// on until revoke or expiry, no new use passes.
	Consumed bool `json:"consumed,omitempty"`
}

// Grants lists the session's grants ("" for all), tombstones included.
func (a *Agent) Grants(session string) []GrantInfo {
	a.mu.Lock()
	defer a.unlock()
	var out []GrantInfo
	for _, g := range a.sortedGrants() {
		if session == "" || g.Session == session {
			gi := GrantInfo{ID: g.ID, Session: g.Session, Capability: g.Capability, Tier: g.Tier, Provenance: g.Provenance,
				Lifecycle: g.Lifecycle, Expires: g.Expires, Parent: g.Parent, Phase: g.Phase, Kernel: g.Kernel}
			if g.Lifecycle == LifecycleOnce && g.Phase == PhaseLive {
				st, err := a.kernel.HandleState(g.Kernel)
				gi.Consumed = err == nil && st == backend.HandleUsed
			}
			out = append(out, gi)
		}
	}
	return out
}
