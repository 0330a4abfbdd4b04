package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Config says where the log lives.
type Config struct {
	// Dir is the state directory (made 0700 if missing). It holds the log,
	// its checkpoint and the signing key; see the package doc.
	Dir string
	// Logger receives warnings (a repaired torn tail); nil: slog.Default().
	Logger *slog.Logger

	now    func() time.Time // tests
	cpHook func(seq uint64) // tests: run before each checkpoint slot's write
}

func (c *Config) validate() error {
	if c.Dir == "" {
		return fmt.Errorf("audit config: empty state directory")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	return nil
}

// Recovery describes a torn tail Open found and moved aside.
type Recovery struct {
	AfterSeq   uint64 // the last intact record
	TornBytes  int64
	TornSHA256 string
	MovedTo    string
}

// maxTorn bounds what Open treats as a torn write: a crash tears at most one
// record; more unterminated bytes than any record can hold is no crash.
const maxTorn = maxLine

// Log is an open audit log. It is safe for concurrent use.
type Log struct {
	cfg    Config
	path   string
	cpPath string
	priv   ed25519.PrivateKey
	pub    ed25519.PublicKey

	mu     sync.Mutex // guards what follows and the order of writes
	f      *os.File
	seq    uint64 // last written record
	hash   string // its hash
	closed bool
	failed error

	syncMu sync.Mutex // one fsync of the log at a time; guards what follows
	synced uint64     // last record known durable

	// The checkpoint trails the log: one writer at a time (checkpoint.go's
	// cpLoop) writes the newest durable head into the slot that does not
	// hold the newest checkpoint. cpMu guards what follows.
	cpMu     sync.Mutex
	cpCond   sync.Cond // on cpMu: cpDone, cpBusy or cpErr changed
	cpWant   uint64    // the newest durable head handed to the writer
	cpHash   string    // its hash
	cpDone   uint64    // the head the newest durable checkpoint vouches for
	cpBusy   bool      // a writer is running
	cpErr    error     // a checkpoint write failed: the Log has failed
	cpClosed bool      // Close: no more checkpoints
	cpFile   *os.File  // the checkpoint file, written in place
	cpNext   int       // the slot the next checkpoint goes to (the writer's)

	recovery *Recovery
	opened   uint64 // the head Open found (after recovery, before its own records)
}

// Open opens (or creates) the audit log in cfg.Dir, generating the signing
// key on first use. It checks that the log continues its checkpoint, moves
// a torn last line aside and records that on the chain (see the package
// doc). It refuses a log whose tail was cut or whose last record does not
// verify, with an error wrapping ErrCorrupt.
func Open(cfg Config) (*Log, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: state directory: %w", err)
	}
	path := filepath.Join(cfg.Dir, LogFile)
	st, err := os.Stat(path)
	logExists := err == nil && st.Size() > 0
	priv, err := loadOrCreateKey(cfg.Dir, logExists)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open log: %w", err)
	}
	l := &Log{
		cfg:    cfg,
		path:   path,
		cpPath: CheckpointPath(path),
		priv:   priv,
		pub:    priv.Public().(ed25519.PublicKey),
		f:      f,
	}
	l.cpCond.L = &l.cpMu
	torn, err := l.recover()
	if err != nil {
		f.Close()
		if l.cpFile != nil {
			l.cpFile.Close()
		}
		return nil, err
	}
	l.opened = l.seq
	if l.recovery != nil {
		r := l.recovery
		cfg.Logger.Warn("audit: torn last record moved aside (crash mid-write?)",
			"log", path, "after_seq", r.AfterSeq, "bytes", r.TornBytes, "sha256", r.TornSHA256, "moved_to", r.MovedTo)
		_, err := l.Append(Event{
			Type:    EventRecovered,
			Outcome: "repaired",
			Reason: fmt.Sprintf("torn tail of %d bytes after seq %d moved to %s (its SHA-256 is shinken.params.sha256)",
				r.TornBytes, r.AfterSeq, filepath.Base(r.MovedTo)),
			Params: torn,
		})
		if err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// recover finds the head of the log, checks it against the checkpoint and
// moves a torn tail aside. It returns the torn bytes, if any.
func (l *Log) recover() ([]byte, error) {
	st, err := l.f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	size := st.Size()
	nl, err := lastNewline(l.f, size)
	if err != nil {
		return nil, fmt.Errorf("audit: read log: %w", err)
	}
	l.seq, l.hash = 0, GenesisHash(l.pub)
	if nl >= 0 {
		prev, err := lastNewline(l.f, nl)
		if err != nil {
			return nil, fmt.Errorf("audit: read log: %w", err)
		}
		line := make([]byte, nl-(prev+1))
		if _, err := l.f.ReadAt(line, prev+1); err != nil {
			return nil, fmt.Errorf("audit: read log: %w", err)
		}
		r, canon, hash, err := parseLine(line)
		if err == nil {
			err = checkSig(l.pub, recordDomain, canon, r.Sig)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: last complete record: %v; run verify", ErrCorrupt, l.path, err)
		}
		l.seq, l.hash = r.Seq, hash
	}

	cs, err := readCheckpoint(l.cpPath, l.pub)
	cp := cs.cp
	create := cs.slot < 0 // none yet, or the single-record file of earlier versions
	switch {
	case errors.Is(err, fs.ErrNotExist) && nl < 0:
		// A fresh log.
		create = true
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: %s is missing next to a non-empty log: the tail cannot be vouched for; run verify", ErrCorrupt, l.cpPath)
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	case cp.Seq > l.seq:
		return nil, fmt.Errorf("%w: %s ends at seq %d but its checkpoint vouches for seq %d: records were cut from the tail", ErrCorrupt, l.path, l.seq, cp.Seq)
	case cp.Seq == l.seq && cp.Hash != l.hash:
		return nil, fmt.Errorf("%w: %s: the record at seq %d is not the one its checkpoint vouches for", ErrCorrupt, l.path, l.seq)
	case cs.torn && cp.Seq == l.seq:
		// A slot is written only after the log was synced past the other
		// slot's seq, so a crash cannot leave this.
		return nil, fmt.Errorf("%w: %s: the newer checkpoint slot is unreadable and the log ends at the older slot's seq %d: records may have been cut from the tail", ErrCorrupt, l.cpPath, l.seq)
	}
	l.synced = cp.Seq
	if cs.torn {
		l.cfg.Logger.Warn("audit: the newer checkpoint slot is torn (crash while writing it?); the older one is used",
			"checkpoint", l.cpPath, "older_seq", cp.Seq, "log_head", l.seq)
	}

	var torn []byte
	if start := nl + 1; start < size {
		if size-start > maxTorn {
			return nil, fmt.Errorf("%w: %s ends in %d bytes without a newline, more than any record: not a torn write", ErrCorrupt, l.path, size-start)
		}
		torn = make([]byte, size-start)
		if _, err := l.f.ReadAt(torn, start); err != nil {
			return nil, fmt.Errorf("audit: read torn tail: %w", err)
		}
		sum := sha256.Sum256(torn)
		moved := fmt.Sprintf("%s.torn-%d-%d", l.path, l.seq, l.cfg.now().UnixNano())
		if err := writeFileSync(moved, torn, 0o600, os.O_EXCL); err != nil {
			return nil, fmt.Errorf("audit: keep torn tail: %w", err)
		}
		if err := l.f.Truncate(start); err != nil {
			return nil, fmt.Errorf("audit: cut torn tail: %w", err)
		}
		if err := l.f.Sync(); err != nil {
			return nil, fmt.Errorf("audit: cut torn tail: %w", err)
		}
		l.recovery = &Recovery{AfterSeq: l.seq, TornBytes: int64(len(torn)), TornSHA256: hex.EncodeToString(sum[:]), MovedTo: moved}
	}
	if create {
		// A new log, or one whose checkpoint is in the old format: from
		// now on the two-slot file, made atomically.
		if err := createCheckpoint(l.cpPath, l.priv, l.seq, l.hash, l.cfg.now()); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		l.synced, l.cpNext = l.seq, 1
	} else {
		l.cpNext = 1 - cs.slot
	}
	if l.cpFile, err = os.OpenFile(l.cpPath, os.O_RDWR, 0); err != nil {
		return nil, fmt.Errorf("audit: open checkpoint: %w", err)
	}
	if l.synced != l.seq {
		// The log got ahead of its checkpoint (a crash between the two):
		// vouch for what is durable now, once it is (a kill -9 leaves the
		// records in the page cache only).
		if err := fdatasync(l.f); err != nil {
			return nil, fmt.Errorf("audit: sync: %w", err)
		}
		if err := writeSlot(l.cpFile, l.cpNext, l.priv, l.seq, l.hash, l.cfg.now()); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		l.synced, l.cpNext = l.seq, 1-l.cpNext
	}
	l.cpWant, l.cpHash, l.cpDone = l.synced, l.hash, l.synced
	return torn, nil
}

// lastNewline returns the offset of the last '\n' before end, or -1.
func lastNewline(f *os.File, end int64) (int64, error) {
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	for end > 0 {
		n := int64(chunk)
		if end < n {
			n = end
		}
		if _, err := f.ReadAt(buf[:n], end-n); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return end - n + int64(i), nil
		}
		end -= n
	}
	return -1, nil
}

// Append records ev and returns the record as written. It returns once the
// record is durable; the checkpoint covering it follows (see the package
// doc). Raw Params are hashed, never stored; every string field is
// redacted.
func (l *Log) Append(ev Event) (Record, error) {
	r, err := l.write(ev)
	if err != nil {
		return Record{}, err
	}
	if err := l.syncTo(r.Seq); err != nil {
		return Record{}, err
	}
	return r, nil
}

// AppendBatch records evs in order and returns once all of them are durable:
// one fsync for the batch (the aggregated denials of a second), and one
// checkpoint after it. On error, the records written before it stay in the log.
func (l *Log) AppendBatch(evs []Event) error {
	var last uint64
	for _, ev := range evs {
		r, err := l.write(ev)
		if err != nil {
			if last > 0 {
				err = errors.Join(err, l.syncTo(last))
			}
			return err
		}
		last = r.Seq
	}
	if last == 0 {
		return nil
	}
	return l.syncTo(last)
}

// Write records ev without waiting for it to be durable: when it returns
// the record is in the file (a kill -9 of the process keeps it) but a power
// loss may still drop it, until a later Append, AppendBatch or Commit
// returns. Never acknowledge a record written so before one of them has.
// A failed write fails the Log as Append's does.
func (l *Log) Write(ev Event) (Record, error) { return l.write(ev) }

// Commit makes every record written so far durable (what Append guarantees
// for its own record), with one fdatasync for all of them (group commit: a
// grant's request and its issue record, written with Write, cost one).
// then, when not nil, is called once the records are durable: work ordered
// after the records (a plain agent.Committer's journal fsync). Their
// checkpoint is written after that by the Log's checkpoint writer, beside
// whatever comes next (see the package doc; Checkpointed waits for it).
// Commit returns when the records are durable and then has returned, with
// their errors joined; then is not called when the records could not be
// made durable.
func (l *Log) Commit(then func() error) error {
	l.mu.Lock()
	seq := l.seq
	l.mu.Unlock()
	return l.syncThen(seq, then)
}

// CommitBeside is Commit with then run beside the log's fdatasync rather
// than after it: then(seq, hash) is called at once, on the caller's
// goroutine, with the seq and hash (Record.Hash) of the last record written
// so far (the batch's), while another goroutine makes the records durable
// and then checkpoints them, so a caller whose own sync (the agent's
// journal) need not wait for the log's waits for one sync instead of two in
// turn. The price is the order: a power loss while both run can keep what
// then wrote and lose the batch, so then must record seq and hash beside
// what it writes and its reader must treat that as unwritten unless the
// log holds that very record (RecordHash at the next Open: a seq alone
// does not do, since the log reuses a lost record's seq for the next
// record it writes). CommitBeside returns when both are done (the records
// durable, not yet checkpointed: see Commit), with their errors joined;
// then is not called on a Log that has already failed, and when the log's
// sync fails after then ran, the error says so (ErrFailed).
func (l *Log) CommitBeside(then func(seq uint64, hash string) error) error {
	l.mu.Lock()
	seq, hash, failed := l.seq, l.hash, l.failed
	l.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("%w: %w", ErrFailed, failed)
	}
	if then == nil {
		return l.syncTo(seq)
	}
	done := make(chan error, 1)
	go func() { done <- l.syncTo(seq) }()
	var thenErr, err error
	func() {
		defer func() { err = <-done }() // a panic in then still waits for the sync
		thenErr = then(seq, hash)
	}()
	return errors.Join(err, thenErr)
}

// OpenedHead is the seq of the last record Open found in the log (after
// moving a torn tail aside, before the records Open itself appends): every
// record up to it survived whatever stopped the previous writer, and Open
// made them durable.
func (l *Log) OpenedHead() uint64 { return l.opened }

// RecordHash returns the hash (Record.Hash) of the log's record at seq,
// read from the end of the file back (the records callers ask about are
// recent: a mark CommitBeside gave); ok is false when the log holds no
// record at seq (0, or beyond its head). A line on the way that is not
// the record its successor names by prev_hash (edited, dropped, moved) is
// an error wrapping ErrCorrupt.
func (l *Log) RecordHash(seq uint64) (hash string, ok bool, err error) {
	l.mu.Lock()
	head, headHash, closed, failed := l.seq, l.hash, l.closed, l.failed
	var size int64
	if !closed && failed == nil {
		// Records are written under mu: the file holds whole records up
		// to head and nothing after them.
		st, serr := l.f.Stat()
		if serr != nil {
			err = fmt.Errorf("audit: %w", serr)
		} else {
			size = st.Size()
		}
	}
	l.mu.Unlock()
	switch {
	case closed:
		return "", false, ErrClosed
	case failed != nil:
		return "", false, fmt.Errorf("%w: %w", ErrFailed, failed)
	case err != nil:
		return "", false, err
	case seq == 0 || seq > head:
		return "", false, nil
	case seq == head:
		return headHash, true, nil
	}
	const chunk = 64 << 10
	end := size - 1    // the last record's newline
	var pending []byte // the file's bytes before end not yet looked at
	off := end
	// Each record on the way is checked by the chain, not by its
	// signature: the head's hash is vouched for (Open verified the last
	// record's signature, or this Log wrote the records since), and a
	// record's hash must be its successor's prev_hash. That checks every
	// record from the head back to seq (a signature check each would not
	// see one dropped or moved) at a SHA-256 a record, where an ed25519
	// verification each made an agent's start at 100,000 sessions spend
	// seconds here when its newest live grant was older than the sessions.
	expect := headHash
	for {
		i := bytes.LastIndexByte(pending, '\n')
		if i < 0 && off > 0 {
			n := min(int64(chunk), off)
			buf := make([]byte, n, n+int64(len(pending)))
			if _, err := l.f.ReadAt(buf, off-n); err != nil {
				return "", false, fmt.Errorf("audit: read log: %w", err)
			}
			pending, off = append(buf, pending...), off-n
			continue
		}
		line := pending[i+1:]
		pending = pending[:max(i, 0)]
		r, _, h, err := parseLine(line)
		if err == nil && h != expect {
			err = fmt.Errorf("the record at seq %d is not the one its successor names (hash %s, want %s)", r.Seq, h, expect)
		}
		if err != nil {
			return "", false, fmt.Errorf("%w: %s: looking for seq %d: %v; run verify", ErrCorrupt, l.path, seq, err)
		}
		expect = r.PrevHash
		switch {
		case r.Seq == seq:
			return h, true, nil
		case r.Seq < seq || i < 0:
			return "", false, nil
		}
	}
}

// write seals and writes one record, not yet durable.
func (l *Log) write(ev Event) (Record, error) {
	r, err := build(ev, l.cfg.now())
	if err != nil {
		return Record{}, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Record{}, ErrClosed
	}
	if l.failed != nil {
		l.mu.Unlock()
		return Record{}, fmt.Errorf("%w: %w", ErrFailed, l.failed)
	}
	if ev.Time.IsZero() {
		// Stamped under the lock, so time never goes back along the chain.
		r.Time = l.cfg.now().UTC().Format(timeFormat)
	}
	r.Seq = l.seq + 1
	r.PrevHash = l.hash
	line, hash, err := seal(&r, l.priv)
	if err == nil && len(line) > maxLine {
		err = fmt.Errorf("%w: record of %d bytes", ErrInvalidEvent, len(line))
	}
	if err != nil {
		l.mu.Unlock()
		return Record{}, err
	}
	if _, err := l.f.Write(line); err != nil {
		l.failed = err
		l.mu.Unlock()
		return Record{}, fmt.Errorf("audit: write: %w", err)
	}
	l.seq, l.hash = r.Seq, hash
	l.mu.Unlock()
	return r, nil
}

// syncTo makes every record up to at least seq durable and hands the new
// durable head to the checkpoint writer; one call does it for every record
// written before it (group commit).
func (l *Log) syncTo(seq uint64) error { return l.syncThen(seq, nil) }

// syncThen is syncTo that calls then (when not nil) once the records are
// durable (Commit).
func (l *Log) syncThen(seq uint64, then func() error) error {
	if err := l.sync(seq); err != nil {
		return err
	}
	if then != nil {
		return then()
	}
	return nil
}

// sync is syncTo.
func (l *Log) sync(seq uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.synced >= seq {
		return nil
	}
	l.mu.Lock()
	head, hash, failed := l.seq, l.hash, l.failed
	l.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("%w: %w", ErrFailed, failed)
	}
	if err := fdatasync(l.f); err != nil {
		// After a failed fsync the page cache may hold what the disk
		// does not: nothing more is written until the log is reopened.
		l.fail(err)
		return fmt.Errorf("%w: sync: %w", ErrFailed, err)
	}
	l.synced = head
	l.checkpoint(head, hash)
	return nil
}

// fail fails the Log with err unless it has failed already.
func (l *Log) fail(err error) {
	l.mu.Lock()
	if l.failed == nil {
		l.failed = err
	}
	l.mu.Unlock()
}

// Head returns the seq and hash of the last record (0 and the genesis hash
// for an empty log).
func (l *Log) Head() (uint64, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq, l.hash
}

// Path is the log file.
func (l *Log) Path() string { return l.path }

// PublicKey is the key Verify needs.
func (l *Log) PublicKey() ed25519.PublicKey { return l.pub }

// Recovered says whether Open found and moved aside a torn tail (nil: no).
func (l *Log) Recovered() *Recovery { return l.recovery }

// Close makes everything appended durable and checkpointed and closes the
// files. It returns a failed checkpoint write's error (Checkpointed).
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	seq, failed := l.seq, l.failed
	l.mu.Unlock()
	var err error
	if failed == nil {
		err = l.syncTo(seq)
	}
	cpErr := l.stopCheckpoints()
	if cpErr != nil && err != nil {
		cpErr = nil // the Log failed with it: err says so
	}
	return errors.Join(err, cpErr, l.f.Close(), l.cpFile.Close())
}
