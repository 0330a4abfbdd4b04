// Package audit is Shinken's tamper-evident authority timeline
// (seeds/permissions.md §8, issue 5 item 5): every request, decision, grant,
// attenuation, revoke, approval, timeout and kernel denial is one JSON-lines
// record, hash-chained and signed with ed25519.
//
// # Who imports it
//
// The daemon (cmd/shinken-agent) and the agent packages under agent/ append
// with Open and (*Log).Append; the operator CLI (cmd/shinkenctl audit verify)
// and tests call Verify. Nothing in dataplane/ or dnsresolver/ imports it.
//
// # Files (all in the state directory given to Open)
//
//	audit.jsonl        the log: one record per line
//	audit.jsonl.head   the signed checkpoint of the head: two 4 KiB slots, each
//	                   "<crc32c> {seq, hash, time, sig}" padded with spaces to a newline
//	audit.key          the ed25519 private key, PKCS#8 PEM, mode 0600, made on first use
//	audit.pub          the public key, PKIX PEM, mode 0644 (give this to verifiers)
//
// # Chain and signatures
//
// A record's canonical bytes are its JSON encoding (encoding/json, fields in
// the order of [Record], empty optional fields omitted) without the "sig"
// field. Its hash is SHA-256 of those bytes, in hex; the next record carries
// it as prev_hash, and seq counts up from 1 with no gaps. The first record's
// prev_hash is [GenesisHash] of the public key, which binds the log to its
// key. "sig" is the base64 ed25519 signature of a domain-separation prefix
// followed by the canonical bytes, and it is always the last field of the
// line, so a line is exactly the canonical bytes with "sig" spliced in before
// the closing brace. [Verify] re-encodes every record and insists on the same
// bytes, so any edit, even of white space, is found.
//
// A separate checkpoint file holds the seq and hash of the head, signed
// (with its own domain prefix) and rewritten after the log's syncs,
// trailing them (see "Durability and crashes"), so dropping the last
// records of the log is detected too: the log then ends before the head
// the checkpoint vouches for.
//
// The checkpoint file has two fixed slots, each in its own file-system
// block, and is kept open: each checkpoint overwrites the slot that does not
// hold the newest one (pwrite) and is made durable with one fdatasync (the
// file's size never changes), with no temp file, rename or directory fsync.
// Each slot carries the CRC-32C of the rest of it, so a slot torn by a crash
// (or never written: all zeros) is recognised as such; a slot whose CRC
// matches but whose checkpoint is not canonical or not signed was edited. A
// reader takes the valid slot with the highest seq. Only the slot being
// written can tear; the other slot still vouches for every record up to
// its seq, and the records after it are those of the window the trailing
// checkpoint leaves (see "Durability and crashes"). The file is
// made whole (atomically, by rename) only for a new log and to migrate the
// single-record checkpoint of earlier versions, which Open and Verify still
// read: the first Open of such a state directory rewrites it as two slots.
//
// # Durability and crashes
//
// Append returns only when its record is on stable storage (the log file
// was fdatasynced: on Linux that also syncs the grown size the record needs
// to be read back; elsewhere fsync). Concurrent appends share one fsync
// (group commit): a record is written under a lock, and whichever appender
// reaches the sync first makes every record written so far durable. The
// bound is therefore exact: no record is ever acknowledged and then lost.
// After a failed write or fsync the Log refuses further appends (fail
// closed); reopen it.
//
// The checkpoint trails the log: after each sync the new durable head is
// handed to one checkpoint writer (a goroutine started when there is work),
// which writes a slot for the newest head it was handed, then, if more
// records became durable meanwhile, one more for the newest head then, and
// so on (coalescing: one slot write and fdatasync covers every batch made
// durable during the previous one). Nothing that acknowledges a record
// waits for it, so a grant waits for one sync of the log, not two in turn.
// Checkpointed waits until the checkpoint covers every record acknowledged
// before it was called, and Close waits for the writer, so a log closed
// cleanly is always checkpointed at its head. The window this opens is the
// records acknowledged after the newest checkpoint on the disk: those the
// slot being written covers, and those made durable while it is written
// (the next slot covers them); one at a time (a grant, then the next), that
// is the last batch, and under concurrent appends the batches of about one
// slot write's time. A crash in that window leaves the log ahead of its
// checkpoint, which Open vouches for again (below); someone who cuts those
// records from the tail before the next Open is not told apart from that
// crash (see "What the signature protects against"). A checkpoint write
// that fails fails the Log as a failed log sync does: it is logged, and
// the next Append, AppendBatch, Commit, CommitBeside, Checkpointed and
// Close return ErrFailed with its cause (the records it would have covered
// are durable and were acknowledged; a torn slot may be on the disk, so no
// other is written).
//
// A caller that makes several records durable together writes them with
// Write (in the file, so a kill -9 keeps them, but not yet durable: a
// power loss may drop them) and then calls Commit: one fdatasync for the
// batch, and a checkpoint vouching for its last record (or a later one)
// after it. Commit's then argument runs once the records are durable (work
// that must follow the records on the disk; a plain agent.Committer's
// grant writes its live record there), beside the checkpoint's write. A
// crash before the checkpoint reached the disk leaves the log ahead of it,
// which Open vouches for again (see below).
//
// CommitBeside is Commit with then run beside the log's fdatasync instead
// of after it, told the seq and hash of the batch's last record: the agent
// writes a grant's live journal record there, with both in it, so the
// grant waits for the journal's sync beside the log's instead of after it.
// The two files' order on the disk is then lost (a power loss may keep the
// journal's record and drop the batch), and the reader restores it:
// RecordHash says which record the log holds at a seq, and a journal
// record whose seq and hash do not name a record the log holds was written
// beside a batch the log lost (the agent rolls such a grant back at
// start). The hash is what makes this exact: the log gives a lost record's
// seq to the next record it writes (the daemon's agent.start record at the
// next start, say), so however far the log gets afterwards, even across
// starts that fail before the agent could record the rollback, a lost
// record is never taken for kept. A record written with Write counts as
// acknowledged only once a Commit, a CommitBeside or a later Append has
// returned.
//
// An append therefore waits for a share of one fdatasync (the log's); the
// checkpoint slot's costs the disk one more per slot written, off the
// caller's path. BenchmarkAppend on this project's shared 2-core machine
// (ext4 on a virtio disk), when the slot's sync was still on the path,
// interleaved with the design before it (checkpoint replaced by temp
// file, fsync, rename and directory fsync), six runs each, medians: a
// lone appender 0.32 ms per record against 0.58 ms, 32 concurrent
// appenders 0.10 ms against 0.11 ms; while other jobs loaded the disk,
// 0.36-0.87 ms against 2.2-4.7 ms for a lone appender. fsync instead of fdatasync for the
// log measured the same (its size grows with every record, so both commit
// the journal). Kernel denials
// can arrive far faster than that: the daemon should aggregate them
// (one kernel_denial record per session, reason and interval, with
// Event.Count) rather than append one record per denied packet.
//
// A crash can leave a torn last line (bytes after the last newline). Open
// detects it, moves the torn bytes to audit.jsonl.torn-<seq>-<unixnano>,
// logs a warning, and appends a signed "audit_recovered" record that names
// the file and the SHA-256 and length of the torn bytes, so the repair is on
// the chain, never silent. The checkpoint is never ahead of the durable log
// (it is written after the fsync), so a log that ends before its checkpoint,
// a last complete record that does not verify, or a missing checkpoint next
// to a non-empty log is not a crash: Open refuses with [ErrCorrupt] and the
// operator runs verify. The same holds for a checkpoint file that is not two
// slots, has no valid slot or has an edited one, and for a torn slot next to
// a log that ends at the other slot's seq (a slot is written only once the
// log holds a later record). A torn slot next to a log that goes further is
// a crash while writing it: Open warns, uses the other slot and overwrites
// the torn one; Verify notes it.
//
// # What the signature protects against
//
// Whoever can read audit.key can forge a whole new log: the signature
// protects against edits by anyone without the key (a session process, a
// backup restore, an attacker with write access to the log only). Ship
// audit.pub and, periodically, the checkpoint off the host to detect a
// rewrite by a host root.
//
// The checkpoint is not an anchor against rollback: an old checkpoint is
// still validly signed, so someone who can replace files can cut the tail
// back to a point where they kept an old checkpoint. Verify then reports the
// checkpoint as behind the log (a Note, since a crash before the trailing
// checkpoint reached the disk leaves the same picture); only a checkpoint
// copied off the host closes that gap. A crash (a power loss, a kill -9)
// leaves the records acknowledged after the newest checkpoint on the disk
// (see "Durability and crashes") unvouched for until the next Open: cutting
// them all but the first before then is not found. The two-slot file
// always holds the previous checkpoint, so such a person needs no copy to
// go back one checkpoint: spoiling the newer slot's CRC looks like a crash
// while writing it (a Note naming the torn slot), and the records after the
// older slot's seq but the first can then be cut unnoticed; cutting all of
// them is still found (see above). One grant at a time, consecutive
// checkpoints are one batch apart: a lone Append's batch is one record, a
// grant's two (its request, then its grant.issue), so its grant.issue
// record can be cut so, leaving the request; under concurrent appends the
// slots can be several batches apart (those one slot write coalesced).
//
// # Field names
//
// Where an OpenTelemetry semantic convention exists its attribute name is
// used as the JSON key; Shinken's own fields live under "shinken.":
//
//	seq, time, prev_hash, sig   the log's own envelope (no convention)
//	event.name                  OTel event name (Event.Type: request, grant, revoke, ...)
//	user.id                     OTel general: the authorising human (Event.Human)
//	gen_ai.agent.id             OTel GenAI: the agent's id (Event.AgentID)
//	gen_ai.request.model        OTel GenAI: the model and version acting (Event.Model)
//	gen_ai.tool.name            OTel GenAI: the tool (Event.Tool)
//	gen_ai.tool.call.id         OTel GenAI: the request / tool call id (Event.CallID)
//	session.id                  OTel session: the Shinken session (Event.Session)
//	shinken.params.sha256       SHA-256 of Event.Params; OTel's gen_ai.tool.call.arguments
//	                            would carry raw values, which never enter this log
//	shinken.action, shinken.resource, shinken.rule.id, shinken.tier,
//	shinken.provenance, shinken.outcome, shinken.reason, shinken.scope,
//	shinken.lifetime, shinken.expires, shinken.handle, shinken.handle.parent,
//	shinken.card.id, shinken.actor, shinken.count, shinken.redacted
//
// # Secrets
//
// The caller passes raw tool parameters in Event.Params; only their SHA-256
// is stored. Every free-text field also goes through [Redact], a regex
// backstop for sk- keys, AWS access key ids, bearer tokens, GitHub and Slack
// tokens, private key blocks, URL passwords and api_key/token/secret/password
// assignments; a record whose fields were redacted lists those fields in
// shinken.redacted. The backstop is best effort: callers must not put
// secrets in events in the first place.
package audit
