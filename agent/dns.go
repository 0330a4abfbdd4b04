package agent

// Grants → the allowlisting DNS resolver: the policy each session's live
// net.egress domain grants give the resolver, and keeping an attached
// resolver in step with the grants (AttachDNS).

import (
	"net/netip"
	"sort"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/dnsresolver"
)

// DNSPolicy derives the allowlisting resolver's policy for session from its
// live net.egress grants: one resolver grant per domain × port range, under
// the grant's kernel handle. A grant that names domains and CIDRs together
// lets its names resolve into those CIDRs even when they are not public (an
// internal service); otherwise the resolver strips non-public answers. ok is
// false when the session does not exist (the resolver should drop it).
func (a *Agent) DNSPolicy(session string) (p dnsresolver.Policy, ok bool) {
	a.mu.Lock()
	defer a.unlock()
	return a.dnsPolicyLocked(session)
}

// dnsPolicyLocked is DNSPolicy; a.mu held.
func (a *Agent) dnsPolicyLocked(session string) (p dnsresolver.Policy, ok bool) {
	return a.dnsPolicyOf(session, a.dnsGrants(map[string]struct{}{session: {}})[session])
}

// dnsGrants returns the live net.egress grants of each of sessions, oldest
// first (sortedGrants' order), from the sessions' own grants (bySession):
// after a grant, the cost of that session's grants, not of every grant the
// state keeps (tombstones included), and no sort of every grant (unlock
// pushes every session's policy at AttachDNS).
func (a *Agent) dnsGrants(sessions map[string]struct{}) map[string][]*GrantRecord {
	out := map[string][]*GrantRecord{}
	for s := range sessions {
		for _, g := range a.bySession[s] {
			a.dnsVisited++
			if g.Phase != PhaseLive || g.Capability.Class != ClassNetEgress || g.Capability.Egress == nil {
				continue
			}
			out[s] = append(out[s], g)
		}
	}
	for _, gs := range out {
		sort.Slice(gs, func(i, j int) bool {
			if !gs[i].Created.Equal(gs[j].Created) {
				return gs[i].Created.Before(gs[j].Created)
			}
			return gs[i].ID < gs[j].ID
		})
	}
	return out
}

// dnsPolicyOf is session's policy from its live net.egress grants (dnsGrants).
func (a *Agent) dnsPolicyOf(session string, grants []*GrantRecord) (p dnsresolver.Policy, ok bool) {
	if s, found := a.st.Sessions[session]; !found || s.Phase != SessionActive {
		return p, false
	}
	for _, g := range grants {
		e := g.Capability.Egress
		var nonPublic []netip.Prefix
		for _, c := range e.CIDRs {
			if !dnsresolver.IsPublic(c.Addr()) {
				nonPublic = append(nonPublic, c)
			}
		}
		for _, dom := range e.Domains {
			for _, pr := range capability.BackendPorts(e.Ports) {
				p.Grants = append(p.Grants, dnsresolver.Grant{Pattern: dom, Handle: g.Kernel, Proto: backend.ProtoAny, Ports: pr, AllowNonPublic: nonPublic})
			}
		}
	}
	return p, true
}

// EgressDomains returns the domain patterns of the session's live net.egress
// grants with their kernel handles, for the DNS resolver to open.
func (a *Agent) EgressDomains(session string) map[string][]backend.HandleRef {
	a.mu.Lock()
	defer a.unlock()
	out := map[string][]backend.HandleRef{}
	for _, g := range a.bySession[session] {
		if g.Phase == PhaseLive && g.Capability.Class == ClassNetEgress {
			for _, d := range g.Capability.Egress.Domains {
				out[d] = append(out[d], g.Kernel)
			}
		}
	}
	return out
}

// DNSTarget is what the agent keeps in step with the grants and the policy
// set: the allowlisting resolver (*dnsresolver.Resolver implements it).
type DNSTarget interface {
	SetPolicy(session string, p dnsresolver.Policy) error
	RemovePolicy(session string)
	// SetDecide gives the resolver the use-time decision to ask for every
	// name its policy allows; DecisionsChanged voids the replies it
	// prepared under the previous policy set.
	SetDecide(f dnsresolver.DecideFunc)
	DecisionsChanged()
}

// AttachDNS gives t the use-time decision (DecideUse, through dnsDecide)
// and every active session's policy now, and from then on the policy of
// each session whose grants or state change, before the call that changed
// them returns (grants, revokes, approvals, expiries, session ends, breaker
// trips, reconcile), and word of every change of the policy set (apply,
// reload) before the call that changed it returns.
func (a *Agent) AttachDNS(t DNSTarget) {
	t.SetDecide(a.dnsDecide)
	a.mu.Lock()
	defer a.unlock()
	a.dns = t
	clear(a.dnsGiven)
	for id, s := range a.st.Sessions {
		if s.Phase == SessionActive {
			a.dnsDirty[id] = struct{}{}
		}
	}
}

// markDNS notes that session's resolver policy may have changed (a grant or
// session event); a.mu held.
func (a *Agent) markDNS(e Event) {
	// The kinds first: only grant and session events, always emitted under
	// a.mu, read a.dns.
	// A pause or resume changes no DNS policy, and is emitted without a.mu
	// (pause.go): it must not touch a.dnsDirty.
	if e.Kind == EventPause || e.Kind == EventResume {
		return
	}
	if (strings.HasPrefix(e.Kind, "grant.") || strings.HasPrefix(e.Kind, "session.")) && e.Session != "" && a.dns != nil {
		a.dnsDirty[e.Session] = struct{}{}
	}
}

// unlock pushes the resolver policies marked since the lock was taken, then
// releases a.mu: the work follows what changed, not the number of sessions.
func (a *Agent) unlock() {
	var grants map[string][]*GrantRecord
	if len(a.dnsDirty) > 0 {
		grants = a.dnsGrants(a.dnsDirty)
	}
	for s := range a.dnsDirty {
		delete(a.dnsDirty, s)
		p, ok := a.dnsPolicyOf(s, grants[s])
		if !ok {
			a.dns.RemovePolicy(s) // ended: nothing to resolve
			delete(a.dnsGiven, s)
			continue
		}
		// The same policy again (a grant without a domain, of net.egress
		// or another class, came or went) is not given again: a new one
		// voids the session's prepared replies and remembered decisions,
		// and no decision about a name can have changed. A name request
		// carries no address, so Decide leaves out every net.egress grant
		// without domains (policy/cedar_index.go: its template is false
		// for such a request, TestDecideMatchesFlatSet), and it evaluates
		// only net.egress grants; the ones with domains are all in p.
		if old, given := a.dnsGiven[s]; given && old.Equal(p) {
			continue
		}
		if err := a.dns.SetPolicy(s, p); err != nil {
			a.cfg.Logger.Error("dns policy", "session", s, "err", err)
			delete(a.dnsGiven, s)
			continue
		}
		a.dnsGiven[s] = p
	}
	a.mu.Unlock()
}

// dnsDecide is the resolver's question for a name its policy allows: the
// same use-time decision as POST /v1/decide (DecideUse: the base and admin
// policies with the hard-deny forbids, plus the session's live grants), for
// a net.egress connect to name on port. An error denies.
func (a *Agent) dnsDecide(session, name string, port uint16) (bool, string) {
	d, err := a.DecideUse(session, UseRequest{Class: ClassNetEgress, Op: "connect", Domain: name, Port: port})
	if err != nil {
		return false, "error: " + err.Error()
	}
	return d.Allowed, d.DecidedBy
}

// dnsDecisionsChanged tells an attached resolver that the policy set
// changed, so no reply it prepared under the previous one is given again.
func (a *Agent) dnsDecisionsChanged() {
	a.mu.Lock()
	t := a.dns
	a.unlock()
	if t != nil {
		t.DecisionsChanged()
	}
}

// SessionName names the session of a kernel index: the resolver's question
// for the address a query came from.
func (a *Agent) SessionName(index uint32) (string, bool) {
	s, err := a.kernel.SessionByIndex(index)
	return s.Name, err == nil
}

// DNSDenial records a query the resolver refused in the agent's event
// stream (the resolver's OnDenial).
func (a *Agent) DNSDenial(d dnsresolver.Denial) {
	a.emit(Event{Kind: EventDNSDeny, Session: d.Session, Rule: d.Rule, Detail: d})
}
