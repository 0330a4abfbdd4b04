// Package wire holds the request and response bodies of the operator API
// (agent/api): what a client sends to and decodes from /v1/... — request
// batches and their results, revoke and attenuate, card approvals, use-time
// decisions and policy changes, session views and runs, event-stream
// records and the error body.
//
// The domain types inside those bodies (GrantRequest, Grant, GrantInfo,
// SessionSpec, UseRequest, UseDecision, Card, PolicyReport ...) are
// agent/capability's; this package adds only what is shaped by HTTP. It is
// its own package, rather than part of agent/capability, because these
// types follow the routes (a status code per result, a cgroup path in a
// session view, NDJSON records) while agent/capability is the agent's own
// vocabulary, used by the policy engine and the agent alike; and it is not
// agent/api itself so that a client links none of the server (net/http
// handlers, the agent, Cedar, the DNS resolver).
//
// It imports the standard library, agent/backend and agent/capability only
// (agent/backend/imports_test.go holds that line). agent/api serves these
// types (it keeps aliases of them under their old names) and
// cmd/shinkenctl and its panel decode them; anyone writing a client may
// import it.
package wire
