package policy

// Decision layer: the probe requests and capabilities of the bounded checks
// (ProveGrant, the permissiveness search): each class's ops, use requests
// built from the literals a policy or scope names and their neighbours, and
// grant probes.

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/capability"
)

// useProbes is the use requests of class c the bounded checks try, built by
// the class's encoding from the literals, appended to dst[:0] (nil: a new
// slice; ProveGrant passes one it reuses, grant after grant).
func useProbes(dst []capability.UseRequest, c capability.Class, lit *literals, pr capability.SessionAttrs) []capability.UseRequest {
	if f := encodingOf(c).useProbes; f != nil {
		return f(dst[:0], c, lit, pr)
	}
	return dst[:0]
}

// egressUseProbes: connects by name (each domain literal and a name below
// it) and by address, on the usual ports and the ports the literals name.
func egressUseProbes(out []capability.UseRequest, c capability.Class, lit *literals, _ capability.SessionAttrs) []capability.UseRequest {
	var domains []string
	for _, s := range lit.strs {
		s = strings.TrimPrefix(strings.TrimPrefix(strings.ToLower(s), "**."), "*.")
		if capability.ValidateDomainPattern(s) == nil {
			domains = append(domains, s, "x."+s)
		}
	}
	domains = sortedUnique(append(domains, "example.com"))
	addrs := probeAddrs(lit)
	ports := probePorts(lit, 443, 80, 22, 53)
	out = slices.Grow(out, len(ports)*(len(domains)+len(addrs)))
	for _, port := range ports {
		for _, d := range domains {
			out = append(out, capability.UseRequest{Class: c, Op: "connect", Domain: d, Port: port})
		}
		for _, a := range addrs {
			out = append(out, capability.UseRequest{Class: c, Op: "connect", IP: a, Port: port})
		}
	}
	return out
}

// inboundUseProbes: peers at the probe addresses opening flows to the
// probe ports, and the same as connects.
func inboundUseProbes(out []capability.UseRequest, c capability.Class, lit *literals, _ capability.SessionAttrs) []capability.UseRequest {
	addrs := probeAddrs(lit)
	for _, port := range probePorts(lit, 443, 80, 8080, 22) {
		for _, a := range addrs {
			// "connect" too: an inbound grant must never answer an
			// egress question.
			for _, op := range []string{"accept", "connect"} {
				out = append(out, capability.UseRequest{Class: c, Op: op, IP: a, Port: port})
			}
		}
	}
	return out
}

// pathUseProbes: every op of the class on the usual paths, the session's
// protected and policy-store paths, and each path literal and a child.
func pathUseProbes(out []capability.UseRequest, c capability.Class, lit *literals, pr capability.SessionAttrs) []capability.UseRequest {
	paths := []string{"/work/x", "/tmp/x"}
	paths = append(paths, pr.Protected...)
	paths = append(paths, pr.PolicyStore...)
	for _, s := range lit.strs {
		if capability.ValidatePath(s) == nil {
			paths = append(paths, s, filepath.Join(s, "x"))
		}
	}
	for _, op := range capability.Ops(c) {
		for _, p := range sortedUnique(paths) {
			out = append(out, capability.UseRequest{Class: c, Op: op, Path: p})
		}
	}
	return out
}

// itemUseProbes: every op of the class on no item, item "0" and the token
// literals, in each of modes.
func itemUseProbes(modes ...string) func([]capability.UseRequest, capability.Class, *literals, capability.SessionAttrs) []capability.UseRequest {
	return func(out []capability.UseRequest, c capability.Class, lit *literals, _ capability.SessionAttrs) []capability.UseRequest {
		items := []string{"", "0"}
		for _, s := range lit.strs {
			if capability.ValidateToken("item", s) == nil && len(items) < 24 {
				items = append(items, s)
			}
		}
		for _, op := range capability.Ops(c) {
			for _, it := range sortedUnique(items) {
				for _, m := range modes {
					out = append(out, capability.UseRequest{Class: c, Op: op, Item: it, Mode: m})
				}
			}
		}
		return out
	}
}

func sortedU16(s []uint16) []uint16 { slices.Sort(s); return s }

// neighbours returns the first and last address of p and the addresses just
// outside it.
func neighbours(p netip.Prefix) []netip.Addr {
	p = p.Masked()
	first := p.Addr()
	last := first
	for i := p.Bits(); i < first.BitLen(); i++ {
		b := last.AsSlice()
		b[i/8] |= 0x80 >> (i % 8)
		last, _ = netip.AddrFromSlice(b)
	}
	out := []netip.Addr{first}
	if last != first {
		out = append(out, last)
	}
	if prev := first.Prev(); prev.IsValid() {
		out = append(out, prev)
	}
	if next := last.Next(); next.IsValid() {
		out = append(out, next)
	}
	return out
}

// grantProbes is the capabilities of class c the permissiveness search asks
// to grant: the empty one, then the class's own.
func grantProbes(c capability.Class, lit *literals) []capability.Capability {
	out := []capability.Capability{capability.Empty(c)}
	if f := encodingOf(c).grantProbes; f != nil {
		out = append(out, f(c, lit)...)
	}
	return out
}

// pathGrantProbes: one capability (made by mk) per path of "/work", "/" and
// the path literals.
func pathGrantProbes(mk func(c capability.Class, path string) capability.Capability) func(capability.Class, *literals) []capability.Capability {
	return func(c capability.Class, lit *literals) []capability.Capability {
		var out []capability.Capability
		paths := []string{"/work", "/"}
		for _, s := range lit.strs {
			if capability.ValidatePath(s) == nil {
				paths = append(paths, s)
			}
		}
		for _, p := range sortedUnique(paths) {
			out = append(out, mk(c, p))
		}
		return out
	}
}

// probeAddrs is the addresses the network probes try: a public, a loopback
// and an IPv6 one, plus the neighbours of every address the policies name.
func probeAddrs(lit *literals) []netip.Addr {
	addrs := []netip.Addr{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("2001:db8::7")}
	for _, p := range lit.ips {
		addrs = append(addrs, neighbours(p)...)
	}
	return addrs
}

// probePorts is base plus every integer the policies name and its
// neighbours that is a port, sorted, without repeats.
func probePorts(lit *literals, base ...uint16) []uint16 {
	ports := append([]uint16(nil), base...)
	for _, l := range lit.longs {
		for _, d := range []int64{-1, 0, 1} {
			if v := l + d; v > 0 && v < 65536 {
				ports = append(ports, uint16(v))
			}
		}
	}
	return slices.Compact(sortedU16(ports))
}

func sortedUnique(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
