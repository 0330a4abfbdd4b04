// Package policy is Shinken's policy engine: the Cedar decision layer and
// the permissiveness checks that guard it.
//
// It embeds the schema (shinken.cedarschema), the base policies (base.cedar)
// and the hard-deny forbids (hard_deny.cedar) that live in this directory,
// loads the admin policy directory with file:line errors, and keeps each
// session's entities and grants (Engine). It answers:
//
//   - use-time requests (Engine.Decide): the base set sliced by class plus
//     the asking session's grants, each a per-class template bound to the
//     grant's entity, with the rule that decided (Decision.DecidedBy) and
//     the approve-once handles the agent must check with the kernel;
//   - grant-time requests (Engine.AuthorizeGrant, step 1 of GRANT) and the
//     bounded check that a grant's compiled policy permits nothing its
//     capability does not cover (ProveGrant, step 2);
//   - policy changes (Engine.LoadSet, Engine.CheckShift, Engine.Install,
//     Engine.Reload): whether an edit widens authority, proven by
//     construction, by the SMT prover of agent/shiftproof (z3, a child
//     process) with any model confirmed by Cedar, or by a bounded search,
//     with a concrete counterexample when it does.
//
// Requests, capabilities and reports are agent/capability's types; Cedar
// values leave this package only for a caller that compares, records or
// measures policy sets (cedar.PolicyMap, Flatten, CedarRequest). The agent drives it (agent.Open
// makes one Engine; the breaker, the approve-once check and the recording
// of applied sets stay in the agent), and bench/decision measures it. The
// operator CLI must not import it: it is what links cedar-go and
// agent/shiftproof (agent/backend/imports_test.go holds that line).
//
// agent/README.md §4 and §5 describe the entity model, the per-grant
// policies, the policy directory and what the permissiveness check proves.
package policy
