package agent

// Step 2 of GRANT, the check that a grant's compiled policy permits nothing
// its capability does not cover (policy.ProveGrant), depends on the session
// and the capability alone: its probes are evaluated now, against a grant
// that has not expired (a grant that would already be expired is refused
// before), and the grant's id only names the policy. So Grant runs it
// before it takes a.mu, and issue, under a.mu, finds the verdict made: the
// Cedar evaluations of the proof (about a third of a grant's CPU) no longer
// hold the lock that orders kernel writes. Only successes are kept, a
// bounded number.

import (
	"encoding/json"
	"sync"
	"time"
)

const maxProofs = 4096

type proofs struct {
	mu sync.Mutex
	ok map[string]struct{}
}

func proofKey(session string, c Capability) string {
	b, _ := json.Marshal(c.Normalized())
	return session + "\x00" + string(b)
}

// prove runs the check unless it passed before for the same session and
// capability.
func (a *Agent) prove(session string, c Capability, now time.Time) error {
	key := proofKey(session, c)
	a.proofs.mu.Lock()
	_, done := a.proofs.ok[key]
	a.proofs.mu.Unlock()
	if done {
		return nil
	}
	if err := ProveGrant(GrantData{ID: "proof", Session: session, Capability: c.Normalized()}, now); err != nil {
		return err
	}
	a.proofs.mu.Lock()
	if a.proofs.ok == nil || len(a.proofs.ok) >= maxProofs {
		a.proofs.ok = map[string]struct{}{}
	}
	a.proofs.ok[key] = struct{}{}
	a.proofs.mu.Unlock()
	return nil
}
