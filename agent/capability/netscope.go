package capability

// What the network classes (net.egress, net.inbound) share: prefix
// validation, port containment, loopback, and ports as the seam's ranges.

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// validatePrefixes checks that every prefix is masked, without zone, and
// IPv4 in IPv4 form; class names the scope in the error.
func validatePrefixes(class Class, ps []netip.Prefix) error {
	for _, p := range ps {
		if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return fmt.Errorf("%w: %s cidr %v (want a masked prefix without zone, IPv4 in IPv4 form)", ErrInvalidCapability, class, p)
		}
	}
	return nil
}

func validatePorts(ps []PortRange) error {
	for _, r := range ps {
		if err := r.validate(); err != nil {
			return err
		}
	}
	return nil
}

// prefixesWithin: every prefix of in lies inside one of out.
func prefixesWithin(in, out []netip.Prefix, widen func(format string, a ...any) error) error {
	for _, p := range in {
		if !slices.ContainsFunc(out, func(o netip.Prefix) bool { return prefixCovers(o, p) }) {
			return widen("cidr %v", p)
		}
	}
	return nil
}

// portsWithin: when the bound names ports, a scope that reaches anything
// (reaches) must name ports too, each inside one of the bound's.
func portsWithin(in, out []PortRange, reaches bool, widen func(format string, a ...any) error) error {
	if len(out) == 0 {
		return nil
	}
	if len(in) == 0 && reaches {
		return widen("ports: any port where the bound allows %v", out)
	}
	for _, r := range in {
		if !slices.ContainsFunc(out, func(o PortRange) bool { return o.Lo <= r.Lo && r.Hi <= o.Hi }) {
			return widen("ports %v", r)
		}
	}
	return nil
}

// portAllowed: port lies in one of ps, or ps is empty (any port).
func portAllowed(ps []PortRange, port uint16) bool {
	return len(ps) == 0 || slices.ContainsFunc(ps, func(p PortRange) bool { return p.Lo <= port && port <= p.Hi })
}

// loopbackOnly: p holds loopback addresses only.
func loopbackOnly(p netip.Prefix) bool {
	return p.Addr().IsLoopback() && prefixCovers(loopbackPrefix(p.Addr()), p)
}

func loopbackPrefix(a netip.Addr) netip.Prefix {
	if a.Is4() {
		return netip.MustParsePrefix("127.0.0.0/8")
	}
	return netip.MustParsePrefix("::1/128")
}

// BackendPorts is a scope's ports as the seam's ranges: any port when none.
func BackendPorts(ports []PortRange) []backend.PortRange {
	if len(ports) == 0 {
		return []backend.PortRange{backend.AnyPort}
	}
	out := make([]backend.PortRange, 0, len(ports))
	for _, p := range ports {
		out = append(out, backend.PortRange{Lo: p.Lo, Hi: p.Hi})
	}
	return out
}

// compileRules is every prefix × every port range (any port when none), any
// transport, all carried by ref; inbound marks the rules of the inbound
// section.
func compileRules(ps []netip.Prefix, ports []PortRange, ref backend.HandleRef, inbound bool) []backend.EgressRule {
	var out []backend.EgressRule
	for _, p := range ps {
		for _, pr := range BackendPorts(ports) {
			out = append(out, backend.EgressRule{Prefix: p, Proto: backend.ProtoAny, Ports: pr, Handle: ref, Inbound: inbound})
		}
	}
	return out
}
