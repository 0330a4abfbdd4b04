// Package backendtest is the conformance suite of the enforcement seam: the
// behaviour every backend.Backend owes the agent, written once, in the style
// of testing/fstest.TestFS and golang.org/x/net/nettest.TestConn.
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T) backend.Backend { return openPrivate(t) })
//	}
//
// Run calls open once per subtest, for a fresh, empty backend (the open
// function removes what it made when the test ends). The subtests cover:
//
//   - sessions: create, destroy, list, by index, duplicate and invalid
//     names, quotas all or nothing;
//   - grants: Apply all or nothing (a Delta with one bad entry leaves
//     nothing), AllowEgress refreshes, Release tolerant of what is gone and
//     refused for a live handle, Revoke idempotent;
//   - the membrane: revoking a parent kills the subtree in one write (Ops:
//     one revoke write, at most one sweep) and nothing can be issued or
//     applied under it any more; the chain is bounded (ErrChainTooDeep);
//   - generations: a recycled slot never revives an old reference;
//   - approve-once: a once handle stays once until a use consumes it;
//   - use: what a connect gets (longest prefix, several rules per prefix,
//     the handle chain, expiries, the never-list and its exceptions,
//     counters and events), through the optional User role;
//   - snapshot: exactly the sessions, handles and per-session Deltas held;
//   - the probe report: every class with a level and a mechanism, a reason
//     for every class unavailable;
//   - launch, where the backend can start a process in a session.
//
// Uses need something that makes them: a backend that implements User
// (the memory backend's Connect) is driven directly; another passes
// WithUser (the Linux conformance test connects from a probe process in
// the session and reads the reason from the denial counters). Without
// either, the use subtests skip and say why.
//
// Only tests import this package. It imports the standard library and
// agent/backend only, so every backend on every GOOS can run it.
package backendtest
