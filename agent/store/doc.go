// Package store is the agent's durable state: what survives a restart, a
// kill -9 at any instant and (for what is synced) a power loss.
//
// # What it stores
//
// One State per state directory: sessions (SessionRecord: spec, phase,
// ingredients, breaker), grants (GrantRecord: capability, tier, lifecycle,
// phase, the kernel handle and the backend.Delta the grant may have in the
// kernel; revoked ones stay as tombstones until the agent prunes them),
// pending approvals (ApprovalRecord), approval cards (capability.Card) and
// approved patterns (Pattern). It holds records, not rules about them: the
// agent (package agent, the caretaker) decides what each record means, when
// it changes and what reconcile does with it. The store imports the seam
// (agent/backend) and the vocabulary (agent/capability) and never the
// agent; the agent re-exports the record types under their old names
// (agent.GrantRecord, agent.SessionRecord ...).
//
// # On disk
//
// Files, mode 0600, in a directory the caller has created (0700):
//
//   - state.json, the snapshot: the whole State as one JSON object
//     {"version":1,"through":N,"sessions":{...},"grants":{...},"approvals":{...},
//     "cards":{...},"patterns":{...}}, replaced only atomically (temporary
//     file, fsync, rename, directory fsync). "through" names the last journal
//     segment it holds (left out while none was folded). A snapshot of
//     another version refuses to load.
//   - state.journal, the records changed since the snapshot, one JSON line
//     each: {"k":"g","id":"ID","v":{...the whole record...}}, or
//     {"k":"g","id":"ID","del":true} for a deletion; k is s(ession),
//     g(rant), a(pproval), c(ard) or p(attern).
//   - state.journal.N (N = 1, 2, ...), segments: earlier journals, renamed
//     when they outgrew the snapshot and not yet folded into it (rotate.go).
//     Transient: a fold removes them, and usually none is on disk.
//
// Open reads the snapshot, replays the segments above its "through" in
// order and then the journal over it (a line carries a whole record or a
// deletion, so replaying lines the snapshot already holds is harmless;
// segments at or below "through" are removed unread, since an older line
// replayed after a newer snapshot would bring a record back), cuts a torn
// last line (one without its newline, or one that
// does not parse: its fsync never returned, so it was never acknowledged)
// and refuses a corrupt line anywhere else (ErrState). Grants written
// before Delta carry their rules as "rules"; Open moves them into the
// Delta, and the record is written in the new form when it next changes or
// at the next snapshot.
// testdata/format pins these bytes.
//
// # Writes
//
// The owner changes the State in place, under its own lock, and then
// writes: Write(keys, sync) the records it names (SessionKey, GrantKey,
// ApprovalKey, CardKey, PatternKey: "s/ID", "g/ID", "a/ID", "c/ID",
// "p/ID"), WriteAll every record that changed since the last write (found
// by encoding each one and comparing hashes with what was last written).
// Either appends one line per changed or deleted record in a single write
// call; a record unchanged since its last write costs nothing. When the
// journal would outgrow max(1 MiB, twice the snapshot), the write first
// rotates it (fsync, rename to the next segment, a fresh journal, directory
// fsync: a few syncs, not the whole State encoded) and appends to the fresh
// one; a goroutine then folds the snapshot and the segments, read back from
// the files one record at a time and never decoded (rawfold.go), into a new
// snapshot and removes the segments. No write waits for a fold, and at most
// one runs. The fold runs on a thread of its own at nice 19, which ends
// with it (background_linux.go), and writes its snapshot out to the disk a
// megabyte at a time as it encodes it (atomicfile.WriteWith), so that the
// requests beside it neither wait for the CPU nor, at their journal's or
// audit log's fsync, for the whole snapshot's data. The price: while the
// agent's own threads keep every CPU busy, the fold gets about a
// seventieth of a CPU against each of them and takes that much longer; the
// journal is not rotated again until it ends, so it grows past its bound
// meanwhile (a start replays it). Store.OnFold hears how each went and
// how long it took.
//
// Which writes are fsynced:
//
//   - WriteAll and Write(keys, true): the journal is fsynced before they
//     return, so what they wrote survives a power loss. The agent writes so
//     every record whose loss would change what the host enforces or what
//     was decided: a grant live or revoked, a session active or ending, an
//     approval asked or answered, a card, a pattern.
//   - Write(keys, false): appended, not fsynced. The lines reach the page
//     cache, which a kill -9 of the process keeps, and a power loss may
//     drop. The agent writes so only intents (its persistIntent): a grant
//     pending, its handle recorded, its Delta about to be pushed, a
//     revocation begun. Losing one is safe because reconcile repairs
//     towards less authority: kernel state no record accounts for is
//     revoked and released at the next start, and a power loss that drops
//     the record drops the kernel state it announced with it (the kernel's
//     tables do not outlive the machine). Journal lines are ordered, and an
//     fsync covers every earlier line, so the next synced write makes the
//     intents before it durable too.
//   - A rotation syncs the journal before renaming it and the directory
//     after; a snapshot (a fold) is always synced, the file and the
//     directory, before the segments it holds are removed. A rotation
//     whose directory sync failed acknowledges no write until one succeeds.
//
// A write that fails (a full disk, a failing device) returns an error
// wrapping ErrState and the cause, and leaves the journal as it was: the
// lines it wrote are cut off, and the records count as not written, so the
// same write retried writes them. The owner restores its State (or keeps
// the change and retries); the store never rolls the State back itself.
//
// Store.Fault is for tests: it fails chosen writes (FaultJournalWrite,
// FaultJournalSync, FaultRotate, FaultSnapshot) as ENOSPC or EIO would, so the agent's
// fault-injection tests (agent/store_fault_test.go) can check that a call
// whose write fails leaves memory, journal and kernel agreeing.
//
// agent/README.md §9 describes the state and crash model as a whole.
package store
