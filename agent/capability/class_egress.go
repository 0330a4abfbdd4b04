package capability

// net.egress: destinations the session may reach, by name or by address.

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// EgressScope is the scope of net.egress. Domains are exact names, "*.name"
// (proper subdomains only) or "**.name" (the name and its subdomains). An
// empty Ports list means every port. TLSInspect asks that the flows go through
// the TLS-inspecting proxy; a scope with it set is narrower than one without.
type EgressScope struct {
	Domains    []string       `json:"domains,omitempty"`
	CIDRs      []netip.Prefix `json:"cidrs,omitempty"`
	Ports      []PortRange    `json:"ports,omitempty"`
	TLSInspect bool           `json:"tls_inspect,omitempty"`
}

func init() {
	register(spec{
		class: ClassNetEgress,
		keys: []key{
			listKey("domains", func(c *Capability) *[]string { return &c.Egress.Domains }),
			prefixesKey("cidrs", func(c *Capability) *[]netip.Prefix { return &c.Egress.CIDRs }),
			portsKey("ports", func(c *Capability) *[]PortRange { return &c.Egress.Ports }),
			boolKey("tls_inspect", func(c *Capability) *bool { return &c.Egress.TLSInspect }),
		},
		ops:      []string{"connect"},
		escalate: true,
		fill: func(c *Capability) {
			if c.Egress == nil {
				c.Egress = &EgressScope{}
			}
		},
		has: func(c *Capability) bool { return c.Egress != nil },
		normalize: func(c *Capability) {
			e := *c.Egress
			e.Domains = sortedUnique(lower(e.Domains))
			e.CIDRs = sortedPrefixes(e.CIDRs)
			e.Ports = sortedPorts(e.Ports)
			c.Egress = &e
		},
		validate: func(c Capability) error {
			for _, d := range c.Egress.Domains {
				if err := ValidateDomainPattern(d); err != nil {
					return err
				}
			}
			if err := validatePrefixes(ClassNetEgress, c.Egress.CIDRs); err != nil {
				return err
			}
			return validatePorts(c.Egress.Ports)
		},
		isEmpty: func(c Capability) bool { return len(c.Egress.Domains) == 0 && len(c.Egress.CIDRs) == 0 },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			in, out := c.Egress, bound.Egress
			for _, d := range in.Domains {
				if !slices.ContainsFunc(out.Domains, func(o string) bool { return domainCovers(o, d) }) {
					return widen("domain %q", d)
				}
			}
			if err := prefixesWithin(in.CIDRs, out.CIDRs, widen); err != nil {
				return err
			}
			if err := portsWithin(in.Ports, out.Ports, len(in.Domains) > 0 || len(in.CIDRs) > 0, widen); err != nil {
				return err
			}
			if out.TLSInspect && !in.TLSInspect {
				return widen("drops tls_inspect")
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			if r.Op != "connect" || !portAllowed(c.Egress.Ports, r.Port) {
				return false
			}
			if r.Domain != "" && slices.ContainsFunc(c.Egress.Domains, func(d string) bool { return domainCovers(d, strings.ToLower(r.Domain)) }) {
				return true
			}
			return r.IP.IsValid() && slices.ContainsFunc(c.Egress.CIDRs, func(p netip.Prefix) bool { return p.Contains(r.IP.Unmap()) })
		},
		// Loopback-only cidrs: auto; anything else: ask.
		tier: func(c Capability, _ TierContext) Tier {
			if len(c.Egress.Domains) == 0 && !slices.ContainsFunc(c.Egress.CIDRs, func(p netip.Prefix) bool { return !loopbackOnly(p) }) {
				return TierAuto
			}
			return TierAsk
		},
		// Anything beyond loopback is external communication.
		ingredients: func(c Capability, i Ingredients) Ingredients {
			if DefaultTier(c, TierContext{}) != TierAuto {
				i.ExternalCommunication = true
			}
			return i
		},
		// "cidrs and domains ports=P,Q".
		summary: func(c Capability) string {
			parts := make([]string, 0, len(c.Egress.CIDRs)+len(c.Egress.Domains))
			for _, p := range c.Egress.CIDRs {
				parts = append(parts, p.String())
			}
			parts = append(parts, c.Egress.Domains...)
			s := strings.Join(parts, ",")
			if len(c.Egress.Ports) > 0 {
				s += " ports=" + portList(c.Egress.Ports)
			}
			return s
		},
		// No TLS-inspecting proxy runs: a grant asking for one is refused.
		unenforced: func(c Capability) error {
			if c.Egress.TLSInspect {
				return ErrTLSInspection
			}
			return nil
		},
		// Every cidr × every port range (any port when none), any
		// transport, all carried by the grant's handle. Domains compile to
		// nothing here: the allowlisting resolver turns their answers into
		// rules under the same handle.
		compile: func(c Capability, ref backend.HandleRef) backend.Delta {
			return backend.Delta{Egress: compileRules(c.Egress.CIDRs, c.Egress.Ports, ref, false)}
		},
	})
}
