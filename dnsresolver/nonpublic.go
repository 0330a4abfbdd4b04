package dnsresolver

import "net/netip"

// nonPublic lists the ranges IsPublic refuses. Sources: IANA IPv4 and IPv6
// special-purpose address registries (RFC 6890 and successors).
var nonPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8",       // "this network"
		"10.0.0.0/8",      // RFC 1918
		"100.64.0.0/10",   // CGNAT, RFC 6598
		"127.0.0.0/8",     // loopback
		"169.254.0.0/16",  // link-local, incl. 169.254.169.254 cloud metadata
		"172.16.0.0/12",   // RFC 1918
		"192.0.0.0/24",    // IETF protocol assignments (incl. 192.0.0.192 Oracle metadata)
		"192.0.2.0/24",    // TEST-NET-1
		"192.88.99.0/24",  // 6to4 relay anycast (deprecated)
		"192.168.0.0/16",  // RFC 1918
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // TEST-NET-2
		"203.0.113.0/24",  // TEST-NET-3
		"224.0.0.0/4",     // multicast
		"240.0.0.0/4",     // reserved, incl. 255.255.255.255 broadcast
		"::/8",            // unspecified, loopback, IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96 and 64:ff9b:1::/48
		"100::/64",        // discard
		"2001::/23",       // IETF protocol assignments, incl. Teredo 2001::/32 (embeds IPv4)
		"2001:db8::/32",   // documentation
		"2002::/16",       // 6to4 (embeds IPv4)
		"3fff::/20",       // documentation, RFC 9637
		"5f00::/16",       // SRv6 SIDs
		"fc00::/7",        // unique local
		"fe80::/10",       // link-local
		"fec0::/10",       // site-local (deprecated)
		"ff00::/8",        // multicast
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// IsPublic reports whether a is a globally routable unicast address, the only
// kind an answer may carry unless a grant's AllowNonPublic covers it. Zoned
// and IPv4-mapped IPv6 addresses are never public.
func IsPublic(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// allows reports whether grant g may resolve to a.
func (g *compiledGrant) allows(a netip.Addr) bool {
	if a.Is4In6() || a.Zone() != "" || SessionPrefix.Contains(a) {
		// A session address is never an answer, whatever AllowNonPublic
		// says: an entry for another session's address would let this
		// session query the resolver as that session.
		return false
	}
	if IsPublic(a) {
		return true
	}
	for _, p := range g.AllowNonPublic {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
