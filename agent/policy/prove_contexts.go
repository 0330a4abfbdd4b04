package policy

// ProveGrant's probe contexts are the same for many grants: every net.egress
// grant is probed at the same fixed addresses, ports and names, besides the
// neighbours of its own literals. A probe's context depends on the probe
// alone (ProveGrant evaluates at one fixed instant, proofInstant), so the
// contexts are kept across grants in a small two-generation cache: a grant
// builds only the contexts of its own literals. Building a context is most
// of a grant's allocation (cedar-go's NewRecord sorts, hashes and copies
// each record), and so most of the daemon's garbage collection under a run
// of grants.

import (
	"sync"
	"time"

	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/capability"
)

// proofInstant is the "now" of every probe: the grant under proof is
// evaluated with no expiry (ProveGrant returns early for one already
// expired), and the only use of "now" in a grant policy is "now <
// expires" (grantCondition), so any instant gives the same verdict as the
// real one. TestProofInstantIrrelevant holds the class encodings to that.
var proofInstant = time.Unix(0, 0).UTC()

// maxProofContexts bounds each generation of the context cache, and
// the key sets kept to build contexts (a port's, an address's, a name's).
const maxProofContexts = 512

type contextCache struct {
	mu       sync.Mutex
	cur, old map[capability.UseRequest]types.Record
	keys     *keyMemo
}

var proofContexts contextCache

// context returns the probe's context at proofInstant. A miss is built
// under the cache's lock (a few microseconds), from key sets kept across
// grants as the contexts are.
func (c *contextCache) context(u capability.UseRequest) types.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.cur[u]; ok {
		return r
	}
	r, ok := c.old[u]
	if !ok {
		if c.keys == nil || len(c.keys.cidr)+len(c.keys.port)+len(c.keys.domain) >= maxProofContexts {
			c.keys = newKeyMemo()
		}
		r = useContextMemo(u, proofInstant, nil, c.keys)
	}
	if c.cur == nil || len(c.cur) >= maxProofContexts {
		c.old, c.cur = c.cur, make(map[capability.UseRequest]types.Record, maxProofContexts)
	}
	c.cur[u] = r
	return r
}
