package capability

// net.inbound: peers that may open flows to the session's own ports (the
// seed's NetworkGrant.inbound, as its own grant).

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// InboundScope is the scope of net.inbound: peers in CIDRs may open flows
// to the session's own Ports (a TCP connection to a listener, a datagram to
// an unconnected UDP socket); an empty Ports list means every local port.
// No CIDR: nobody may connect in (the zero scope). A connection admitted
// under it carries data both ways for as long as the grant lives; it never
// lets the session connect or send anywhere (that is net.egress).
type InboundScope struct {
	CIDRs []netip.Prefix `json:"cidrs,omitempty"`
	Ports []PortRange    `json:"ports,omitempty"`
}

func init() {
	register(spec{
		class: ClassNetInbound,
		keys: []key{
			prefixesKey("cidrs", func(c *Capability) *[]netip.Prefix { return &c.Inbound.CIDRs }),
			portsKey("ports", func(c *Capability) *[]PortRange { return &c.Inbound.Ports }),
		},
		ops:      []string{"accept"},
		escalate: true,
		fill: func(c *Capability) {
			if c.Inbound == nil {
				c.Inbound = &InboundScope{}
			}
		},
		has: func(c *Capability) bool { return c.Inbound != nil },
		normalize: func(c *Capability) {
			c.Inbound = &InboundScope{CIDRs: sortedPrefixes(c.Inbound.CIDRs), Ports: sortedPorts(c.Inbound.Ports)}
		},
		validate: func(c Capability) error {
			if err := validatePrefixes(ClassNetInbound, c.Inbound.CIDRs); err != nil {
				return err
			}
			return validatePorts(c.Inbound.Ports)
		},
		isEmpty: func(c Capability) bool { return len(c.Inbound.CIDRs) == 0 },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			in, out := c.Inbound, bound.Inbound
			if err := prefixesWithin(in.CIDRs, out.CIDRs, widen); err != nil {
				return err
			}
			return portsWithin(in.Ports, out.Ports, len(in.CIDRs) > 0, widen)
		},
		allows: func(c Capability, r UseRequest) bool {
			if r.Op != "accept" || !r.IP.IsValid() || !portAllowed(c.Inbound.Ports, r.Port) {
				return false
			}
			return slices.ContainsFunc(c.Inbound.CIDRs, func(p netip.Prefix) bool { return p.Contains(r.IP.Unmap()) })
		},
		// Ask, loopback included (other sessions on the host connect from
		// loopback); only a manifest tier or an admin policy lowers it.
		tier: func(Capability, TierContext) Tier { return TierAsk },
		// Peers that connect in both send and read: outside loopback that
		// is external communication and ingestion at once.
		ingredients: func(c Capability, i Ingredients) Ingredients {
			for _, p := range c.Inbound.CIDRs {
				if !loopbackOnly(p) {
					i.ExternalCommunication = true
					i.ExternalIngestion = true
				}
			}
			return i
		},
		// "from cidrs ports=P,Q" (its ports are the session's own).
		summary: func(c Capability) string {
			parts := make([]string, 0, len(c.Inbound.CIDRs))
			for _, p := range c.Inbound.CIDRs {
				parts = append(parts, p.String())
			}
			s := "from " + strings.Join(parts, ",")
			if len(c.Inbound.Ports) > 0 {
				s += " ports=" + portList(c.Inbound.Ports)
			} else {
				s += " any port"
			}
			return s
		},
		// Every cidr (where a peer connects from) × every port range (the
		// session's own ports; any when none), any transport, marked
		// Inbound.
		compile: func(c Capability, ref backend.HandleRef) backend.Delta {
			return backend.Delta{Inbound: compileRules(c.Inbound.CIDRs, c.Inbound.Ports, ref, true)}
		},
	})
}
