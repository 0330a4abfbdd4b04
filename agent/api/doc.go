// Package api is the agent's operator API: HTTP+JSON on a Unix socket,
// authorised by the caller's kernel credentials (SO_PEERCRED and
// SO_PEERGROUPS: root, or a member of the operator group). Processes inside a
// session are refused whatever their uid. Paths are versioned under /v1; the
// routes are listed in the repository's README ("Operator API") and served
// by Server.
//
// The socket is served by a Front (front.go): a lean loop answers
// POST /v1/decide on keep-alive connections (the enforcers' hot path) and
// hands a connection to net/http's server at its first other request; both
// paths call Server.ServeHTTP.
//
// It is a transport: each handler decodes a call, hands it to the agent (or,
// for quotas, runs and counters, to the backend) and encodes the answer. The
// domain logic behind the calls (approval cards, patterns, batching, the DNS
// policy that follows the grants) is the agent's.
//
// Its request and response bodies are agent/api/wire's (aliased here under
// their old names), so a client speaks the API without linking the server:
// cmd/shinken-agent (the daemon) imports this package, and bench/ for the
// old names; cmd/shinkenctl imports agent/api/wire and agent/capability.
package api
