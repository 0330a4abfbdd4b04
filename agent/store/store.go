package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/shinken-agent/shinken/agent/backend"
)

// ErrState wraps failures to read or write the durable state. Its text
// ("agent: state") predates this package and is kept: operators and the
// API's error mapping know it.
var ErrState = errors.New("agent: state")

// Store persists one State as a snapshot (state.json, replaced atomically:
// temporary file, fsync, rename, directory fsync) plus a journal
// (state.journal) of the records changed since: each write appends one line
// per changed or deleted record, so a change costs what it changed, not the
// size of the whole state. When the journal outgrows the snapshot it is
// renamed to a numbered segment (state.journal.N) and a fresh journal
// begun; a goroutine then folds the segments into a new snapshot from the
// files alone (rotate.go), so no write waits for the whole state to be
// encoded. A kill -9 at any instant leaves a snapshot and
// a journal whose last line may be torn; a torn last line was never
// acknowledged (its fsync never returned) and is dropped on load. Replaying
// a journal over a snapshot that already holds its changes is harmless:
// every line carries a whole record or a deletion.
//
// A Store is not safe for concurrent use: its owner changes the State and
// calls Write or WriteAll under one lock (the agent's a.mu). The fold's
// goroutine touches only the snapshot and the segments, never the State or
// the journal the owner appends to.
type Store struct {
	// Fault is for tests: when set, it is asked before every write and sync
	// of the store's files (FaultJournalWrite, FaultJournalSync,
	// FaultSnapshot); an error it returns is that write's error, as a full
	// disk (ENOSPC) or a failing device (EIO) would give. Leave it nil
	// otherwise.
	Fault func(op string) error
	// OnFold, when set, hears of every background fold (and of a rotation
	// that could not be made), on the fold's goroutine: set it before the
	// first write. A fold that failed leaves its segments in place (Open
	// replays them) and is tried again at the next rotation.
	OnFold func(Fold)

	dir     string
	st      *State
	seen    map[string][32]byte // record key -> SHA-256 of its last persisted form
	journal *os.File
	jbytes  int64         // journal size
	sbytes  atomic.Int64  // snapshot size (the fold sets it)
	seg     uint64        // the highest segment number in use (0: none yet)
	folding chan struct{} // closed when the running fold ends; nil before the first
	// dirty: a rotation's directory sync failed; no write is acknowledged
	// until the directory's entries are durable (syncDirty).
	dirty bool
}

// journalLine is one journal entry: a whole record, or a deletion.
type journalLine struct {
	Kind string          `json:"k"` // s(ession) | g(rant) | a(pproval) | c(ard) | p(attern)
	ID   string          `json:"id"`
	Rec  json.RawMessage `json:"v,omitempty"`
	Del  bool            `json:"del,omitempty"`
}

// The writes Store.Fault is asked about.
const (
	FaultJournalWrite = "journal.write"  // appending lines to the journal
	FaultJournalSync  = "journal.sync"   // fsyncing the journal after an append
	FaultSnapshot     = "snapshot"       // writing a new snapshot (a fold)
	FaultRotate       = "journal.rotate" // renaming the journal to a segment
)

// minCompact is the journal size below which it is never rotated and folded.
const minCompact = 1 << 20

// Open loads the state kept in dir (which must exist): the snapshot, if
// any, then the journal replayed over it, a torn last line cut off, and
// grants of state files older than Delta migrated ("rules" into "delta").
// The journal stays open for appending until Close. A snapshot of another
// version, or a corrupt journal line before the last, is an error wrapping
// ErrState.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir}
	st, err := s.load()
	if err != nil {
		s.Close()
		return nil, err
	}
	s.st = st
	return s, nil
}

// State is the state the store persists. Its owner changes it in place and
// then names what changed (Write) or has the store find out (WriteAll);
// a change not yet written is not durable.
func (s *Store) State() *State { return s.st }

func (s *Store) path() string        { return filepath.Join(s.dir, "state.json") }
func (s *Store) journalPath() string { return filepath.Join(s.dir, "state.journal") }

func (s *Store) load() (*State, error) {
	st, size, err := readSnapshot(s.path())
	if err != nil {
		return nil, err
	}
	s.sbytes.Store(size)
	if err := s.replaySegments(st); err != nil {
		return nil, err
	}
	if err := s.replay(st); err != nil {
		return nil, err
	}
	migrateLegacy(st)
	s.seen = map[string][32]byte{}
	for _, r := range st.records() {
		b, err := json.Marshal(r.v)
		if err != nil {
			return nil, fmt.Errorf("%w: encode: %w", ErrState, err)
		}
		s.seen[r.key] = hashBytes(b)
	}
	return st, nil
}

// readSnapshot reads the snapshot at path (an empty State when there is
// none) and its size.
func readSnapshot(path string) (*State, int64, error) {
	st := newState()
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, 0, fmt.Errorf("%w: %w", ErrState, err)
	default:
		if err := json.Unmarshal(data, st); err != nil {
			return nil, 0, fmt.Errorf("%w: %s: %w", ErrState, path, err)
		}
		if st.Version != stateVersion {
			return nil, 0, fmt.Errorf("%w: %s: version %d, want %d", ErrState, path, st.Version, stateVersion)
		}
		st.fillMaps()
	}
	return st, int64(len(data)), nil
}

// migrateLegacy moves the rules of grants written before Delta into it.
func migrateLegacy(st *State) {
	for _, g := range st.Grants {
		migrateGrant(g)
	}
}

// migrateGrant moves the rules of one grant written before Delta into it.
func migrateGrant(g *GrantRecord) {
	if len(g.LegacyRules) > 0 && g.Delta.IsEmpty() {
		g.Delta = backend.DeltaOf(g.LegacyRules)
	}
	g.LegacyRules = nil
}

// replay applies the journal to st and opens it for appending, cutting off a
// torn last line.
func (s *Store) replay(st *State) error {
	f, err := os.OpenFile(s.journalPath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("%w: read journal: %w", ErrState, err)
	}
	good, err := replayLines(f, st.apply, s.journalPath())
	if err != nil {
		f.Close()
		return err
	}
	if good < fi.Size() {
		if err := f.Truncate(good); err != nil {
			f.Close()
			return fmt.Errorf("%w: cut torn journal tail: %w", ErrState, err)
		}
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	s.journal = f
	s.jbytes = good
	return nil
}

// Close waits for a running fold and releases the journal. The store must
// not be used afterwards.
func (s *Store) Close() error {
	s.waitFold()
	if s.journal == nil {
		return nil
	}
	err := s.journal.Close()
	s.journal = nil
	return err
}

// WriteAll persists every record that changed since the last write (found
// by encoding each one: it costs the whole state), with one append and one
// fsync, or folds everything into a new snapshot when the journal has
// outgrown it. Deleted records are written as deletions.
func (s *Store) WriteAll() error { return s.save(s.st) }

// save is WriteAll of st.
func (s *Store) save(st *State) error {
	var buf bytes.Buffer
	next := make(map[string][32]byte, len(s.seen))
	for _, r := range st.records() {
		b, err := json.Marshal(r.v)
		if err != nil {
			return fmt.Errorf("%w: encode: %w", ErrState, err)
		}
		h := hashBytes(b)
		next[r.key] = h
		if old, ok := s.seen[r.key]; ok && old == h {
			continue
		}
		journalEntry(&buf, r.key, b)
	}
	for key := range s.seen {
		if _, ok := next[key]; !ok {
			journalEntry(&buf, key, nil)
		}
	}
	if buf.Len() == 0 {
		return nil
	}
	if err := s.rotateIfDue(buf.Len()); err != nil {
		return err
	}
	if err := s.appendJournal(buf.Bytes(), true); err != nil {
		return err
	}
	s.seen = next
	return nil
}

// faultAt is the test hook's verdict on one write (nil without a hook).
func (s *Store) faultAt(op string) error {
	if s.Fault == nil {
		return nil
	}
	return s.Fault(op)
}

// appendJournal writes lines to the journal and, when sync, fsyncs it; on
// a failed write or sync it cuts what it wrote, so no half line is left for
// the next append and a record that was not acknowledged is not replayed.
// An unsynced append is an intent a crash of the process keeps (the page
// cache survives a kill -9) and a power loss may drop: only records whose
// loss reconcile repairs are written so (the agent's persistIntent).
func (s *Store) appendJournal(lines []byte, sync bool) error {
	cut := func(err error) error {
		s.journal.Truncate(s.jbytes)
		s.journal.Seek(s.jbytes, io.SeekStart)
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	if err := s.syncDirty(); err != nil {
		return err
	}
	if err := s.faultAt(FaultJournalWrite); err != nil {
		return cut(err)
	}
	if _, err := s.journal.Write(lines); err != nil {
		return cut(err)
	}
	if sync {
		if err := s.faultAt(FaultJournalSync); err != nil {
			return cut(err)
		}
		if err := s.journal.Sync(); err != nil {
			return cut(err)
		}
	}
	s.jbytes += int64(len(lines))
	return nil
}

// Write persists the records named by keys (SessionKey, GrantKey,
// ApprovalKey, CardKey, PatternKey), for callers that know exactly which
// records they changed since the last write: it costs those records, not
// the whole state. A named record that is gone from the State is written as
// a deletion; one unchanged since its last write is skipped. A record a
// caller changed but did not name is not written (WriteAll finds it later),
// and would be lost on a crash until then.
//
// With sync the journal is fsynced before Write returns: the records are
// durable. Without it they reach the page cache only, which survives a
// kill -9 of the process but not a power loss; write so only records whose
// loss is safe (see the package documentation). Either way a failed write
// leaves the journal as it was. When the journal would outgrow the
// snapshot, Write folds the whole state into a new snapshot instead
// (WriteAll), synced whatever sync says.
func (s *Store) Write(keys []string, sync bool) error { return s.writeKeys(s.st, sync, keys) }

// writeKeys is Write of st.
func (s *Store) writeKeys(st *State, sync bool, keys []string) error {
	var buf bytes.Buffer
	type upd struct {
		key string
		h   [32]byte
		del bool
	}
	var ups []upd
	for _, key := range keys {
		v, ok := st.lookup(key)
		if !ok {
			if _, had := s.seen[key]; had {
				journalEntry(&buf, key, nil)
				ups = append(ups, upd{key: key, del: true})
			}
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%w: encode: %w", ErrState, err)
		}
		h := hashBytes(b)
		if old, ok := s.seen[key]; ok && old == h {
			continue
		}
		journalEntry(&buf, key, b)
		ups = append(ups, upd{key: key, h: h})
	}
	if buf.Len() == 0 {
		return nil
	}
	if err := s.rotateIfDue(buf.Len()); err != nil {
		return err
	}
	if err := s.appendJournal(buf.Bytes(), sync); err != nil {
		return err
	}
	for _, u := range ups {
		if u.del {
			delete(s.seen, u.key)
		} else {
			s.seen[u.key] = u.h
		}
	}
	return nil
}

// journalEntry appends one journal line for key: a whole record, or a
// deletion when rec is nil.
func journalEntry(buf *bytes.Buffer, key string, rec []byte) {
	jl := journalLine{Kind: key[:1], ID: key[2:], Rec: rec, Del: rec == nil}
	line, _ := json.Marshal(jl)
	buf.Write(line)
	buf.WriteByte('\n')
}

func hashBytes(b []byte) [32]byte { return sha256.Sum256(b) }
