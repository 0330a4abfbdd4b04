package capability

import (
	"encoding/json"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Event is one lifecycle step for the audit trail. It never carries a
// secret: scopes are hashed (ParamsSHA256) and summarized by class.
type Event struct {
	Time         time.Time `json:"time"`
	Kind         string    `json:"kind"` // session.create, grant.request, grant.issue, grant.rollback, grant.revoke, approval.*, card.*, breaker.trip, deny, reconcile.*
	Session      string    `json:"session,omitempty"`
	Grant        string    `json:"grant,omitempty"`
	Class        Class     `json:"class,omitempty"`
	Tier         string    `json:"tier,omitempty"`
	Provenance   string    `json:"provenance,omitempty"`
	ParamsSHA256 string    `json:"params_sha256,omitempty"`
	Outcome      string    `json:"outcome,omitempty"`
	Rule         string    `json:"rule,omitempty"`
	Actor        string    `json:"actor,omitempty"`
	Card         *Card     `json:"card,omitempty"` // card.* events: the card as it stands
	// Tool is the program of a process.run event; Args its argv, which
	// never leave the agent but for the audit log (it hashes them).
	Tool string   `json:"tool,omitempty"`
	Args []string `json:"-"`
	// Denial is the kernel's event of a kernel.deny.
	Denial *backend.Event `json:"denial,omitempty"`
	// Requester, Lifecycle and Parent (a grant id, never a token) describe
	// a request or attenuation as it was asked; Params is its capability
	// as asked, for the audit log only (the log hashes it).
	Requester string          `json:"requester,omitempty"`
	Lifecycle string          `json:"lifecycle,omitempty"`
	Parent    string          `json:"parent,omitempty"`
	Params    json.RawMessage `json:"-"`
	// Took is how long the call an event closes took (request.decided,
	// revoke.done): for the latency metrics, not shown.
	Took time.Duration `json:"-"`
	// Defer says the sink may return from Emit once the record is
	// written, before it is durable: the agent makes it durable with a
	// later Commit (a sink that is an agent.Committer; any other sink
	// writes every event durably). The agent sets it only on records it
	// commits before it answers and before it makes durable any state they
	// describe (a grant's request and issue records, its live record).
	Defer bool `json:"-"`
	// Detail is what a component beside the agent reported (dns.deny: the
	// resolver's denial), carried as it was given.
	Detail any `json:"detail,omitempty"`
}
