// Package api is the agent's operator API: HTTP+JSON on a Unix socket,
// authorised by the caller's kernel credentials (SO_PEERCRED and
// SO_PEERGROUPS: root, or a member of the operator group). Processes inside a
// session are refused whatever their uid. Paths are versioned under /v1; the
// routes are listed in the README of this package and served by Server.
//
// It is a transport: each handler decodes a call, hands it to the agent (or,
// for quotas, runs and counters, to the backend) and encodes the answer. The
// domain logic behind the calls (approval cards, patterns, batching, the DNS
// policy that follows the grants) is the agent's.
//
// Only cmd/shinken-agent (the daemon) and cmd/shinkenctl (the client side
// types) import this package.
package api
