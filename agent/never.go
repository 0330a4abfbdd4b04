package agent

// The never-list (link-local and metadata addresses, the agent's own
// listeners) is refused in the kernel before any grant is consulted. A grant
// reaches a never-listed destination only where it names that exact address
// (and one port, or every port) and an admin policy of the policy directory
// permits the use: then its rule is NeverOK. A 0.0.0.0/0 grant never is.

import (
	"slices"
	"strings"
	"time"

	cedar "github.com/cedar-policy/cedar-go"

	"github.com/shinken-agent/shinken/agent/backend"
)

func (a *Agent) neverList() []backend.NeverEntry {
	return append(slices.Clone(backend.DefaultNeverList), a.cfg.NeverList...)
}

// neverListed reports whether addr:port is on the never-list.
func neverListed(list []backend.NeverEntry, r backend.EgressRule) bool {
	for _, n := range list {
		if n.Prefix.Contains(r.Prefix.Addr()) && (n.Port == 0 || r.Ports.Lo == r.Ports.Hi && r.Ports.Lo == n.Port) {
			return true
		}
	}
	return false
}

// neverExceptions marks NeverOK the rules that name one never-listed
// address (and one port or every port) an admin policy permits this session
// to reach.
func (a *Agent) neverExceptions(session string, rules []backend.EgressRule) []backend.EgressRule {
	list := a.neverList()
	for i, r := range rules {
		if r.Inbound || r.Prefix.Bits() != r.Prefix.Addr().BitLen() || r.Ports.Lo != r.Ports.Hi || !neverListed(list, r) {
			continue
		}
		u := UseRequest{Class: ClassNetEgress, Op: "connect", IP: r.Prefix.Addr(), Port: r.Ports.Lo}
		if _, ok := a.engine.adminPermits(session, u, a.cfg.Now()); ok {
			rules[i].NeverOK = true
		}
	}
	return rules
}

// adminPermits evaluates a use request against the base set only (shipped
// and policy-directory policies, no grants) and returns the admin permit
// that allowed it.
func (e *Engine) adminPermits(session string, r UseRequest, now time.Time) (string, bool) {
	s, err := e.session(session)
	if err != nil {
		return "", false
	}
	d, diag := cedar.Authorize(e.base.Load().policies, s.entities, cedar.Request{
		Principal: sessionUID(session), Action: actionUse, Resource: capabilityUID(r.Class), Context: useContext(r, now),
	})
	if d != cedar.Allow {
		return "", false
	}
	for _, reason := range diag.Reasons {
		if !strings.HasPrefix(string(reason.PolicyID), "grant:") {
			return string(reason.PolicyID), true
		}
	}
	return "", false
}
