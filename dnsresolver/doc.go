// Package dnsresolver is Shinken's allowlisting DNS resolver: the place where
// the names an operator granted become kernel egress entries, and the only DNS
// path out of a session.
//
// # Identity
//
// The kernel (bpf/, backend.Backend.SetDNSRedirect) rewrites every UDP and TCP
// port-53 connect and sendmsg made inside a session to the session's own
// loopback address, SessionAddr(index) = 127.128.0.0 + the session's kernel
// index, on the resolver's port. The resolver binds 0.0.0.0:<port>, learns
// the address each query arrived on (IP_PKTINFO for UDP, the accepted
// connection's local address for TCP), answers UDP from that same address,
// and derives the session from that address alone (Config.SessionName),
// never from anything in the packet. A query that arrived on an address that
// is no live session's is refused (unknown_session); over UDP, one that
// arrived on a non-loopback address gets no reply at all, so the socket
// bound to 0.0.0.0 can never reflect spoofed datagrams.
//
// # Sharing the resolver fairly
//
// UDP queries arrive on Config.UDPSockets sockets bound to the one port
// with SO_REUSEPORT, plus a penalty socket, each read by its own worker
// threads. A BPF program on the group (sk_reuseport) steers each datagram
// by its destination, the session address: every query of a session
// reaches the same socket (session address mod UDPSockets), and a session
// in the penalty box reaches the penalty socket, up to its query rate, the
// rest dropped by the kernel before the agent reads them (KernelDropped),
// so a flood fills one socket's queue and not the others', and costs the
// agent what its rate allows (reuseport_linux.go, steer_linux.go). Before anything else is
// done with a query (UDP or TCP), it takes a token from its session's
// query bucket (Config.QueryRate, QueryBurst; limit.go): over the rate it
// is answered REFUSED at once from its own bytes (reason rate, one Denial a
// second per session, every one counted). A session that sends QueryRate
// queries over its rate within a second goes into the penalty box
// (penalty.go) until penaltyHold after the last: there its queries over
// the rate get no reply at all (RateDropped; over TCP the connection is
// closed). A UDP worker answers only what needs no upstream and no kernel
// write; a query that needs either goes to a goroutine of its own (at most
// MaxInflight, PerSessionLimit per session, beyond that dropped and
// counted), so neither a slow upstream nor the dataplane's lock ever holds
// the queries behind it. A change of one session's grants (SetPolicy, which
// the agent calls whenever the session's policy is no longer the one it gave:
// a grant with a domain came or went; Policy.Equal) drops that session's
// prepared replies and remembered decisions only, at the cost of that session's entries: another
// session's prepared replies and written entries stay good (before
// 2026-12-05 every such change walked the shared caches and voided every
// session's prepared replies). The write memo is kept per session too: a
// session's end voids that session's prepared replies only. Each bounded
// table the sessions share (the answer cache, the prepared replies, the
// remembered decisions, the write memo; share.go) drops, when full, what
// the sessions holding the most put there, largest first, down to three
// quarters of its bound (the answer cache its expired answers first, and
// it counts an answer as the session's whose query fetched it): a session
// asking for a flood of distinct names evicts its own, and the others keep
// their cached answers (before 2026-12-05 a full answer cache evicted at
// random and the prepared replies and decisions were emptied whole).
//
// # One query
//
//  1. Identify the session (above), and take a query token (above).
//  2. Check the message: one question, class IN, opcode QUERY.
//  3. Canonicalise the name (CanonicalName): NUL, control characters, CR/LF,
//     percent-encoding, escapes (any byte outside LDH on the wire), '_',
//     non-ASCII, empty and over-long labels and names, leading or trailing
//     '-' and all-numeric top-level labels are refused; ASCII is lower-cased
//     and one trailing dot dropped.
//  4. Check the session's Policy (SetPolicy): deny patterns override grants;
//     a name no grant matches is refused (REFUSED, or NXDOMAIN with
//     Config.DenyRcode) with a Denial event (Config.OnDenial) and a counter
//     by session and reason. A refused name is NEVER forwarded upstream:
//     forwarding it would itself be the exfiltration channel.
//  5. Ask the agent's use-time decision (SetDecide; the daemon's agent gives
//     it Agent.DecideUse, the same decision as POST /v1/decide: base, admin
//     and hard-deny Cedar policies plus the session's live grants) for the
//     name, once per distinct port range of the matching grants, with the
//     range's first port (0 for every port): the resolver does not know the
//     port the client will use, so a forbid naming only some ports inside a
//     grant's range is not seen here. Grants whose range is denied are
//     dropped; if none is left the name is refused like a policy denial
//     (reason decision, the deciding rule in Denial.Rule), never forwarded.
//     An answer is remembered per session, name and port while the
//     session's policy and the decision's generation (below) are unchanged,
//     so retries, A and AAAA, and TCP queries ask once. Without a hook the
//     policy alone decides.
//  6. Query types: A and AAAA are resolved and write entries. HTTPS, SVCB and
//     CNAME get an empty NOERROR answer built locally (HTTPS/SVCB address
//     hints and ECH keys would bypass the entries; clients fall back to
//     A/AAAA). Types in Config.PassthroughTypes (none by default; e.g. TXT,
//     MX) are forwarded for allowed names, filtered to the CNAME chain and
//     write nothing. ANY and everything else are refused (reason qtype).
//  7. Answer from the shared cache, or ask the upstream (Config.Upstreams,
//     default the nameservers of /etc/resolv.conf) with a freshly built
//     query: only the canonical name and type travel, never the client's
//     EDNS options, client subnet or cookies. Upstream failure (timeout,
//     SERVFAIL, REFUSED, a reply that does not match) is SERVFAIL. The
//     answer is bounded before anything is built from it: the cache keeps
//     at most 4 × Config.MaxAnswerRecords (default 16) of its addresses and
//     MaxAnswerRecords of its other records, in the upstream's order.
//  8. Follow the CNAME chain from the question name, at most
//     Config.MaxCNAMEChain links (longer, or a loop: SERVFAIL). As in
//     Cilium's toFQDNs, the CNAME targets of an allowed name are allowed
//     under the grants that matched the question name; a target that
//     matches a deny pattern, or is not a valid host name, refuses the whole
//     answer (cname_denied), and so does a target the decision of step 5,
//     asked for the target under the grants kept so far, denies (decision).
//     Records not on the chain are dropped, and a fresh answer is built from
//     what is kept.
//  9. Drop addresses that are not public (IsPublic: loopback, RFC 1918,
//     CGNAT, link-local and cloud metadata, TEST-NETs, benchmarking,
//     multicast, reserved, broadcast, IPv4-mapped and other IPv4-embedding
//     IPv6, ULA, site- and link-local, documentation) unless the grant lists
//     a prefix holding them in AllowNonPublic, so DNS rebinding cannot reach
//     them. IPv4-mapped IPv6 and session resolver addresses (127.128.0.0/9)
//     are dropped whatever AllowNonPublic says. The host's own addresses
//     (Config.HostAddrs, kept current from netlink address updates:
//     WatchHostAddrs), public or not, are dropped unless the grant names
//     the address exactly: a /32 or /128 prefix in AllowNonPublic (a wider
//     range holding it does not). The answer keeps the first
//     MaxAnswerRecords addresses left; the rest are never built, written
//     or sent, and TC stays clear.
//  10. Write one egress rule per kept address and matching grant through
//     Dataplane.AllowEgress (a /32 or /128 carrying the grant's handle,
//     protocol and ports, expiring after the record's TTL clamped to
//     [Config.MinTTL, Config.MaxTTL]) BEFORE the answer is sent: the
//     answer reaches the session only once the kernel allows every address
//     in it. If a write fails the client gets SERVFAIL and no answer: fail
//     closed; if the dataplane refuses it because the session holds its cap
//     of DNS-derived entries (backend.ErrEntryCap), the client gets
//     DenyRcode and OnDenial a Denial with ReasonEntryCap (the entries
//     expire and are collected, which frees the cap). A cached answer whose rule this resolver already wrote with
//     the same expiry skips the write (Config.AlwaysWrite turns that off).
//     The writes first take tokens from the session's write bucket
//     (Config.WriteRate, WriteBurst): without enough, the answer is
//     withheld (SERVFAIL, WriteLimited). Over UDP, an answer that must
//     write is completed off the worker (above).
//  11. Answer with the clamped (and, from the cache, decremented) TTLs, so a
//     client's cache never outlives the kernel entry; the question's case is
//     kept (0x20). A reply is truncated (whole records dropped, TC set) to
//     what the client can take: over UDP its EDNS size (512 without, at most
//     1232), over TCP the 65,535 bytes a frame's length can say.
//
// A repeated plain UDP query (fast.go) is answered from the reply the steps
// above last built for the same session index, name and type, with its ID,
// flags, case, TTLs and OPT patched in, but only after the name passed the
// checks of step 3 on the wire and while the session at that address, its
// policy, the decision's generation, the cached result, the record of
// written entries and the host's address set are all unchanged; otherwise
// it takes the steps above. The fast path never asks the decision: SetDecide and DecisionsChanged (the
// agent calls it whenever its policy set is replaced: POST /v1/policies,
// SIGHUP reload) bump the generation, and grant and session changes come
// with SetPolicy, so a prepared reply is never given once the full path
// could decide otherwise. FuzzFastPath checks that
// the two give the same bytes.
//
// While the agent restarts nothing listens on the port: queries fail (ICMP
// port unreachable, or a refused TCP connect) rather than leak, and entries
// already in the kernel keep working until they expire.
//
// # For the agent
//
// Wiring: r, err := New(Config{Dataplane: dp, SessionName: SessionNames(dp)}),
// r.Start(), then dp.SetDNSRedirect(r.Port()). SetPolicy(session, Policy)
// gives a session its grants (Grant: Pattern "host", "*.host" or "**.host",
// Handle, Proto, Ports, AllowNonPublic) and deny patterns, replacing the
// previous policy atomically; RemovePolicy drops it. SetDecide gives it the
// use-time decision of step 5 and DecisionsChanged says that decision may
// have changed (agent.AttachDNS does both). Stats and WriteMetrics
// expose the counters (per session: queries refused or dropped for rate,
// answers withheld for want of write tokens, host addresses stripped);
// Penalised lists the sessions in the penalty box; Close stops. Without
// Config.HostAddrs, Start watches the host's addresses itself; a daemon
// that also feeds the kernel's never-list from them makes one HostAddrs,
// runs WatchHostAddrs and passes it in. Every backend.Backend is a Dataplane and
// a SessionIndexer as it is.
//
// Only agent/, cmd/ and bench/ import this package.
package dnsresolver
