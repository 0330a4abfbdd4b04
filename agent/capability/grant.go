package capability

// Grants as callers see them: the request for one (GrantRequest), the grant
// issued (Grant), how long it lives (Lifecycle), where it stands (GrantPhase)
// and the read-only view of it (GrantInfo).

import (
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// GrantRequest asks for one capability for one session.
type GrantRequest struct {
	Session    string        `json:"session"`
	Capability Capability    `json:"capability"`
	Provenance Provenance    `json:"provenance"`
	Lifecycle  Lifecycle     `json:"lifecycle"`        // once | session (standing is refused)
	TTL        time.Duration `json:"ttl,omitempty"`    // 0: once → the agent's DefaultOnceTTL; session → until session end
	Parent     string        `json:"parent,omitempty"` // a handle token: attenuate that grant
	Requester  string        `json:"requester,omitempty"`
	// Escalation marks a request the agent made from a kernel denial (its
	// EscalateDenial): it always goes to a human (at least Ask), never
	// auto-granted, whatever the tier table says.
	Escalation bool `json:"-"`
}

// Grant is what a caller gets back for an issued grant.
type Grant struct {
	Handle    string    `json:"handle"` // the unforgeable token
	ID        string    `json:"id"`
	Session   string    `json:"session"`
	Tier      Tier      `json:"tier"`
	Lifecycle Lifecycle `json:"lifecycle"`
	Expires   time.Time `json:"expires,omitzero"`
	Parent    string    `json:"parent,omitempty"`
}

// Lifecycle says how long a grant lives (seeds/permissions.md §6.3).
type Lifecycle string

const (
	LifecycleOnce     Lifecycle = "once"     // one action; dies after its first use (or its short TTL)
	LifecycleSession  Lifecycle = "session"  // until the session ends (or the TTL)
	LifecycleStanding Lifecycle = "standing" // admin policy only; never issued in-session
)

// GrantPhase is where a grant stands in the GRANT / REVOKE sequences. The
// phase is persisted before the kernel step it announces, so after a crash
// reconcile knows what may have been applied.
type GrantPhase string

const (
	PhasePending    GrantPhase = "pending"    // intent recorded; the kernel handle may or may not exist
	PhaseHandle     GrantPhase = "handle"     // kernel handle issued and recorded
	PhaseApplying   GrantPhase = "applying"   // OS delta being pushed; Delta holds what may be in the kernel
	PhaseLive       GrantPhase = "live"       // everything applied; the grant is in force
	PhaseRevoking   GrantPhase = "revoking"   // the handle's bit is flipped; teardown under way
	PhaseRevoked    GrantPhase = "revoked"    // tombstone: revoked and torn down
	PhaseRolledBack GrantPhase = "rolledback" // tombstone: a grant that never went live
)

// Terminal reports whether the phase is a tombstone.
func (p GrantPhase) Terminal() bool { return p == PhaseRevoked || p == PhaseRolledBack }

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
	// Overrides are the paths of the grant's file entries that an admin
	// policy permits (backend.FileEntry.Override): where one names a
	// credential location, the session's view opens it.
	Overrides []string `json:"overrides,omitempty"`
}
