// Package memory is an in-memory backend.Backend: the Linux backend's
// semantics (dataplane/) held in Go maps, for tests that must run without
// root, without a BPF kernel, and on every GOOS.
//
// It enforces nothing on the host. No process runs inside its sessions
// (Launch returns an error wrapping backend.ErrNotSupported), and its probe
// says so: Backend "memory", net.egress and net.inbound at the level the
// Linux backend gives them, each with a mechanism and a reason that name it
// a test double; every other class unavailable, as on Linux. What the kernel
// would decide at use time is asked through (*Backend).Connect (a connect or
// unconnected send) and (*Backend).Accept (a new inbound flow), which
// evaluate the tables exactly as the BPF programs do:
//
//  1. the session is looked up (no session: denied, counted at index 0);
//  2. an unspecified destination is loopback; DNS (port 53) goes to the
//     resolver when a redirect is set;
//  3. the never-list comes before any grant: a never-listed destination
//     passes only through the session's admin-named exception (a NeverOK
//     rule), checked under the one handle the exception points at;
//  4. otherwise the exact-address entry, then the covering prefixes from
//     the longest to the shortest (at most MaxCover), each holding up to
//     MaxRules rules (protocol, ports, own expiry, handle);
//  5. a matching rule allows when its handle and every ancestor (at most
//     MaxChain) is live or approve-once and unexpired; the allowing
//     approve-once handle is consumed by a compare-and-swap (HandleOnce to
//     HandleUsed), so of two racing uses exactly one passes.
//
// Handles live in a slot table with generations, like the kernel's: a
// recycled slot never revives an old reference. Revoke is one state write
// and one (modelled) sweep, counted in Ops; Apply is all or nothing;
// Release reclaims a dead grant's entries and slot.
//
// The Linux backend is the reference, its quirks included: where it departs
// from the seam's contract ("a call that fails leaves the kernel as it
// was"), the model does the same, so the agent behaves on both alike, and
// TestLinuxQuirks pins each one (fix both together):
//
//   - a failed Apply removes every entry of the Delta it added before the
//     failure, so an entry that was already there (the same rule under the
//     same handle) goes too, and a Delta naming one entry twice fails its
//     undo ("undo incomplete");
//   - Release removes the Delta's entries first, then refuses to free a
//     live handle's slot (ErrInvalidHandle).
//
// The conformance suite checks only what the contract says.
//
// For the agent's crash and fault tests, FailNext makes a chosen call fail
// with a chosen error, and CrashAfter makes the next Apply or Release panic
// after k of its entries, leaving them as a backend that died there would.
//
// Standard library only. Only tests (and tools that simulate a host) import
// it; the daemon never does.
package memory
