package agent

// The never-list (link-local and metadata addresses, the agent's own
// listeners) is refused in the kernel before any grant is consulted. A grant
// reaches a never-listed destination only where it names that exact address
// (and one port, or every port) and an admin policy of the policy directory
// permits the use: then its rule is NeverOK. A 0.0.0.0/0 grant never is.
// Exceptions are derived from the policies in force: at grant time, and
// again for every live grant at each policy change (forbids.go).

import (
	"net/netip"
	"strings"

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
	for i, r := range rules {
		if a.neverOK(session, r) {
			rules[i].NeverOK = true
		}
	}
	return rules
}

// neverOK says whether rule r of session is an exception to the never-list
// under the policies in force; a.mu held.
func (a *Agent) neverOK(session string, r backend.EgressRule) bool {
	if r.Inbound || r.Prefix.Bits() != r.Prefix.Addr().BitLen() || r.Ports.Lo != r.Ports.Hi || !neverListed(a.neverList(), r) {
		return false
	}
	u := UseRequest{Class: ClassNetEgress, Op: "connect", IP: r.Prefix.Addr(), Port: r.Ports.Lo}
	_, ok := a.engine.AdminPermit(session, u, a.cfg.Now())
	return ok
}

// neverReaches says whether the kernel lets a use Decide allowed (its
// permits: reasons) through the never-list: a destination not on it, or
// one a NeverOK rule of a grant among the permits names (one address, and
// its port or every port), as the kernel's exceptions are. It reads no
// state under a.mu: the never-list in force (a.neverView) and each live
// grant's NeverOK rules (a.neverRules) are published for it.
func (a *Agent) neverReaches(r UseRequest, reasons []string) bool {
	list := a.neverView.Load()
	if !r.IP.IsValid() || list == nil {
		return true
	}
	ip := r.IP.Unmap()
	rule := backend.EgressRule{Prefix: netip.PrefixFrom(ip, ip.BitLen()), Ports: backend.Port(r.Port)}
	if !neverListed(*list, rule) {
		return true
	}
	for _, reason := range reasons {
		id, ok := strings.CutPrefix(reason, "grant:")
		if !ok {
			continue
		}
		v, ok := a.neverRules.Load(id)
		if !ok {
			continue
		}
		for _, n := range v.([]backend.EgressRule) {
			if n.Prefix.Addr() == ip && n.Prefix.Bits() == ip.BitLen() && (n.Ports.IsAny() || n.Ports.Lo == r.Port) {
				return true
			}
		}
	}
	return false
}

// noteNeverRules publishes rec's NeverOK rules for neverReaches.
func (a *Agent) noteNeverRules(rec *GrantRecord) {
	var rs []backend.EgressRule
	for _, r := range rec.Delta.Egress {
		if r.NeverOK {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		a.neverRules.Delete(rec.ID)
		return
	}
	a.neverRules.Store(rec.ID, rs)
}
