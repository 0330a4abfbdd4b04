package capability

// Approval cards as callers see them: the Ask-tier requests of one session
// and one tier, paused for a human and decided together (the agent's
// cards.go keeps them).

import "time"

// CardItem is one paused request on a card.
type CardItem struct {
	Approval   string     `json:"approval"` // the agent's pending approval id
	Actor      string     `json:"actor"`    // who asked (agent id / model version)
	Action     string     `json:"action"`   // always "UseCapability" for now
	Resource   Class      `json:"resource"`
	Scope      Capability `json:"scope"`
	Provenance Provenance `json:"provenance"`
	Lifecycle  Lifecycle  `json:"lifecycle"`
	Rule       string     `json:"rule"` // the tier rule that fired
	Tier       Tier       `json:"tier"`
}

// Card is an approval card: sibling requests of one session and one tier,
// decided together.
type Card struct {
	ID      string     `json:"id"`
	Session string     `json:"session"`
	Tier    Tier       `json:"tier"`
	Created time.Time  `json:"created"`
	Expires time.Time  `json:"expires"`
	Items   []CardItem `json:"items"`
	// Status: pending, approved, denied (an explicit no), cancelled (a
	// dismissal), timed_out (nobody answered: the actions did not run).
	Status   string `json:"status"`
	Decision string `json:"decision,omitempty"` // once | session | pattern
	Decider  string `json:"decider,omitempty"`
}

// Card statuses.
const (
	CardPending   = "pending"
	CardApproved  = "approved"
	CardDenied    = "denied"
	CardCancelled = "cancelled"
	CardTimedOut  = "timed_out"
)
