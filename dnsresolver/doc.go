// Package dnsresolver is Shinken's allowlisting DNS resolver: the place where
// the names an operator granted become kernel egress entries, and the only DNS
// path out of a session.
//
// The kernel (bpf/, dataplane/) rewrites every UDP and TCP port-53 connect and
// sendmsg made inside a session to the session's own loopback address
// (SessionAddr: 127.128.0.0 + the session's kernel index) on the resolver's
// port. The resolver learns which address a query arrived on (IP_PKTINFO for
// UDP, the accepted connection's local address for TCP) and derives the
// session from that address alone, never from anything in the packet.
//
// For each query the resolver, in this order:
//
//  1. maps the arrival address to a session, or REFUSES (unknown_session);
//  2. canonicalises the question name (CanonicalName): NUL, control
//     characters, percent-encoding, escapes, non-LDH characters, empty,
//     over-long labels and names are refused, ASCII is lower-cased and one
//     trailing dot dropped;
//  3. checks the session's Policy: deny patterns override grants; a name no
//     grant matches is refused (REFUSED, or NXDOMAIN if so configured) with a
//     Denial event and a counter, and is NEVER forwarded upstream (forwarding
//     it would itself be the exfiltration channel);
//  4. applies the query-type policy: A and AAAA are resolved; HTTPS and SVCB
//     (whose address hints and ECH keys would bypass the entries written below)
//     and CNAME get an empty NOERROR answer built locally; ANY and every other
//     type are refused unless listed in Config.PassthroughTypes;
//  5. asks the upstream with a freshly built query (nothing of the client's
//     message but the canonical name and type is forwarded: no EDNS options,
//     no client subnet, no cookies), or answers from its cache;
//  6. follows the CNAME chain from the question name (at most
//     Config.MaxCNAMEChain links). Like Cilium's toFQDNs, the CNAME targets of
//     an allowed name are allowed under the grants that matched the question
//     name; a target that matches a deny pattern refuses the whole answer.
//     Records not on the chain are dropped;
//  7. drops addresses that are not public (loopback, RFC 1918, CGNAT,
//     link-local and metadata, TEST-NETs, benchmarking, multicast, reserved,
//     IPv4-mapped and other IPv4-embedding IPv6, ULA, documentation...) unless
//     the grant lists a prefix containing them in AllowNonPublic; so DNS
//     rebinding cannot reach them;
//  8. writes one egress rule per kept address and matching grant (a /32 or
//     /128 with the grant's handle, protocol and ports, expiring after the
//     record's TTL clamped to [MinTTL, MaxTTL]) through Dataplane.AllowEgress,
//     BEFORE the answer is sent. If any write fails the client gets SERVFAIL
//     and no answer: fail closed;
//  9. answers with the clamped TTLs, so the client's cache never outlives the
//     kernel entry.
//
// Upstream failure (timeout, error, SERVFAIL from upstream, a chain longer
// than the cap) is SERVFAIL. While the agent restarts nothing listens on the
// port, so queries fail; entries already in the kernel keep working until
// they expire.
//
// Only agent/, cmd/ and bench/ import this package.
package dnsresolver
