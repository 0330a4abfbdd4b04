// Package capability is Shinken's capability grammar and the vocabulary
// that crosses the operator API.
//
// The grammar: the nine classes (Class, the seam's typed enum), each one
// registry entry in its own file (class_<name>.go; registry.go says what an
// entry holds), and their typed scopes (Capability; the zero scope of every
// class grants nothing), normalization and validation, the manifest-syntax
// rendering, containment (Within, the exact check for manifests and
// attenuation), the grammar's own meaning of a capability for one use-time
// request (Allows), per-image manifests (ParseManifests, with file:line
// errors), the risk tiers with provenance promotion and the "at most two of
// three" rule (EffectiveTier), and a capability's section of a grant's
// backend.Delta (Compile).
//
// The vocabulary: what callers send and get back — GrantRequest and Grant,
// GrantInfo, SessionSpec, UseRequest and UseDecision, approval cards, the
// lifecycle Event, the host's Enforcement per class, a policy change and the
// permissiveness gate's report (PolicyChange, PolicyReport, ShiftReport) —
// and the sentinel errors the agent and the policy engine share.
//
// It is pure data and pure functions: it imports the standard library and
// agent/backend (the seam, standard library only) and nothing else, so the
// operator CLI (cmd/shinkenctl) can speak the API without linking Cedar, the
// DNS resolver or the shift prover. Anyone may import it: agent (which keeps
// aliases of these names), agent/policy, agent/api and its wire types,
// cmd/ and bench/. agent/backend/imports_test.go holds that line.
//
// The agent's README.md (agent/README.md, §1 to §3) describes the grammar,
// the manifest format and the tier table.
package capability
