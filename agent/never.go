package agent

// The never-list (link-local and metadata addresses, the agent's own
// listeners) is refused in the kernel before any grant is consulted. A grant
// reaches a never-listed destination only where it names that exact address
// (and one port, or every port) and an admin policy of the policy directory
// permits the use: then its rule is NeverOK. A 0.0.0.0/0 grant never is.

import (
	"github.com/shinken-agent/shinken/agent/backend"
)

// neverList is the never-list in force; a.mu held.
func (a *Agent) neverList() []backend.NeverEntry { return a.never }

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
		if _, ok := a.engine.AdminPermit(session, u, a.cfg.Now()); ok {
			rules[i].NeverOK = true
		}
	}
	return rules
}
