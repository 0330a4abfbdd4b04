// Package agent is Shinken's control plane: it decides what the kernel
// enforces and keeps the authority timeline.
//
// It drives the policy engine (agent/policy: Cedar, the shipped schema and
// base policies, an admin policy directory, hard-deny forbids, per-grant
// policies whose scope is entity data) over the capability grammar
// (agent/capability: nine classes, every one empty by default, per-image
// manifests, the four risk tiers with provenance promotion and the "at most
// two of three" rule), and holds what follows from the decisions: the
// pre-grant gate with its permissiveness-shift check, caretaker handles
// (unforgeable tokens mapped to kernel HandleRefs, attenuation, membrane
// revoke), the GRANT and REVOKE sequences of seeds/permissions.md §2, the
// denial circuit breaker, approval cards (Asks batched for a human,
// approved patterns), and durable state (agent/store: a snapshot and an
// append-only journal of the records that changed) that survives a kill -9
// at any step and is reconciled with the kernel on start, always in the
// fail-closed direction.
//
// The entry point is Open, which returns an *Agent driving a
// backend.Backend (on Linux the BPF dataplane; see agent/backend). See
// README.md in this directory for the packages and files by layer, the
// grammar, the manifest format, the tiers, the policy directory, what the
// permissiveness check proves and the state and crash model. The names
// that moved to agent/capability, agent/policy and agent/store are kept
// here as aliases (aliases.go), so agent.Capability, agent.GrantRequest,
// agent.Engine or agent.GrantRecord still mean what they meant.
//
// Only agent/api (the operator API's transport), cmd/shinken-agent (the
// daemon) and bench/ import this package; the operator CLI does not (it
// speaks the API through agent/capability and agent/api/wire). Secrets never
// enter its events or logs: scopes are hashed and credentials are broker
// scope names, never values.
package agent
