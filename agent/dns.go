package agent

// Grants → the allowlisting DNS resolver: the policy each session's live
// net.egress domain grants give the resolver.

import (
	"net/netip"

	"github.com/shinken-agent/shinken/agent/backend"
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
	defer a.mu.Unlock()
	if s, found := a.st.Sessions[session]; !found || s.Phase != SessionActive {
		return p, false
	}
	for _, g := range a.sortedGrants() {
		if g.Session != session || g.Phase != PhaseLive || g.Capability.Class != ClassNetEgress || g.Capability.Egress == nil {
			continue
		}
		e := g.Capability.Egress
		var nonPublic []netip.Prefix
		for _, c := range e.CIDRs {
			if !dnsresolver.IsPublic(c.Addr()) {
				nonPublic = append(nonPublic, c)
			}
		}
		for _, dom := range e.Domains {
			for _, pr := range e.portRanges() {
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
	defer a.mu.Unlock()
	out := map[string][]backend.HandleRef{}
	for _, g := range a.st.Grants {
		if g.Session == session && g.Phase == PhaseLive && g.Capability.Class == ClassNetEgress {
			for _, d := range g.Capability.Egress.Domains {
				out[d] = append(out[d], g.Kernel)
			}
		}
	}
	return out
}
