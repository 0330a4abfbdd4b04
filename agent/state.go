package agent

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
)

// ErrState wraps failures to read or write the durable state.
var ErrState = errors.New("agent: state")

// GrantRecord is one grant as persisted.
type GrantRecord struct {
	ID         string            `json:"id"` // the handle id (hex of the token's random part)
	Session    string            `json:"session"`
	Capability Capability        `json:"capability"`
	Tier       Tier              `json:"tier"`
	Provenance Provenance        `json:"provenance"`
	Lifecycle  Lifecycle         `json:"lifecycle"`
	Expires    time.Time         `json:"expires,omitzero"`
	Parent     string            `json:"parent,omitempty"` // parent grant id (attenuation)
	Approver   string            `json:"approver,omitempty"`
	Kernel     backend.HandleRef `json:"kernel"`
	// Delta is the grant's OS state (from PhaseApplying on: what may be in
	// the kernel).
	Delta backend.Delta `json:"delta,omitzero"`
	// LegacyRules is the rule list of state files written before Delta
	// (net.egress and net.inbound rules); it is moved into Delta on load.
	LegacyRules []backend.EgressRule `json:"rules,omitempty"`
	Phase       GrantPhase           `json:"phase"`
	Created     time.Time            `json:"created"`
	Ended       time.Time            `json:"ended,omitzero"`
	EndReason   string               `json:"end_reason,omitempty"`
}

// SessionPhase is where a session stands.
type SessionPhase string

const (
	SessionCreating SessionPhase = "creating"
	SessionActive   SessionPhase = "active"
	SessionEnding   SessionPhase = "ending"
)

// SessionRecord is one session as persisted.
type SessionRecord struct {
	Spec        SessionSpec  `json:"spec"`
	Phase       SessionPhase `json:"phase"`
	Ingredients Ingredients  `json:"ingredients"`
	Breaker     BreakerState `json:"breaker"`
	Created     time.Time    `json:"created"`
}

// ApprovalRecord is one pending Ask. Request.Parent is always empty (a handle
// token is a capability and is never stored or listed); ParentGrant names the
// parent grant of an attenuation.
type ApprovalRecord struct {
	ID          string       `json:"id"`
	Request     GrantRequest `json:"request"`
	ParentGrant string       `json:"parent_grant,omitempty"`
	Tier        Tier         `json:"tier"`
	Created     time.Time    `json:"created"`
	Expires     time.Time    `json:"expires"`
}

// state is everything the agent persists.
type state struct {
	Version   int                        `json:"version"`
	Sessions  map[string]*SessionRecord  `json:"sessions"`
	Grants    map[string]*GrantRecord    `json:"grants"`
	Approvals map[string]*ApprovalRecord `json:"approvals"`
	Cards     map[string]*Card           `json:"cards,omitempty"`    // approval cards (cards.go)
	Patterns  map[string]*Pattern        `json:"patterns,omitempty"` // approved patterns, by "card/item"
}

const stateVersion = 1

func newState() *state {
	return &state{Version: stateVersion, Sessions: map[string]*SessionRecord{}, Grants: map[string]*GrantRecord{}, Approvals: map[string]*ApprovalRecord{},
		Cards: map[string]*Card{}, Patterns: map[string]*Pattern{}}
}

// store persists the state as a snapshot (state.json, replaced atomically:
// temporary file, fsync, rename, directory fsync) plus a journal
// (state.journal) of the records changed since: each save appends one line
// per changed or deleted record and fsyncs once, so a change costs what it
// changed, not the size of the whole state. When the journal outgrows the
// snapshot it is folded into a new snapshot. A kill -9 at any instant leaves
// a snapshot and a journal whose last line may be torn; a torn last line was
// never acknowledged (its fsync never returned) and is dropped on load.
// Replaying a journal over a snapshot that already holds its changes is
// harmless: every line carries a whole record or a deletion.
type store struct {
	dir string
	// fault, when set (tests), is asked before every write and sync of the
	// store's files ("journal.write", "journal.sync", "snapshot"); an error
	// it returns is that write's error, as a full disk (ENOSPC) or a
	// failing device (EIO) would give.
	fault   func(op string) error
	seen    map[string][32]byte // record key -> SHA-256 of its last persisted form
	journal *os.File
	jbytes  int64 // journal size
	sbytes  int64 // snapshot size
}

// journalLine is one journal entry: a whole record, or a deletion.
type journalLine struct {
	Kind string          `json:"k"` // s(ession) | g(rant) | a(pproval) | c(ard) | p(attern)
	ID   string          `json:"id"`
	Rec  json.RawMessage `json:"v,omitempty"`
	Del  bool            `json:"del,omitempty"`
}

// minCompact is the journal size below which it is never folded.
const minCompact = 1 << 20

func (s *store) path() string        { return filepath.Join(s.dir, "state.json") }
func (s *store) journalPath() string { return filepath.Join(s.dir, "state.journal") }

func (s *store) load() (*state, error) {
	st := newState()
	data, err := os.ReadFile(s.path())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	default:
		if err := json.Unmarshal(data, st); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrState, s.path(), err)
		}
		if st.Version != stateVersion {
			return nil, fmt.Errorf("%w: %s: version %d, want %d", ErrState, s.path(), st.Version, stateVersion)
		}
		st.fillMaps()
	}
	s.sbytes = int64(len(data))
	if err := s.replay(st); err != nil {
		return nil, err
	}
	for _, g := range st.Grants {
		if len(g.LegacyRules) > 0 && g.Delta.IsEmpty() {
			g.Delta = backend.DeltaOf(g.LegacyRules)
		}
		g.LegacyRules = nil
	}
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

// replay applies the journal to st and opens it for appending, cutting off a
// torn last line.
func (s *store) replay(st *state) error {
	f, err := os.OpenFile(s.journalPath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return fmt.Errorf("%w: read journal: %w", ErrState, err)
	}
	good := 0
	for good < len(data) {
		nl := bytes.IndexByte(data[good:], '\n')
		if nl < 0 {
			break // torn: no newline, never acknowledged
		}
		line := data[good : good+nl]
		var jl journalLine
		if err := json.Unmarshal(line, &jl); err != nil {
			if good+nl+1 == len(data) {
				break // torn last line
			}
			f.Close()
			return fmt.Errorf("%w: %s: corrupt line at byte %d: %w", ErrState, s.journalPath(), good, err)
		}
		if err := st.apply(jl); err != nil {
			f.Close()
			return fmt.Errorf("%w: %s: byte %d: %w", ErrState, s.journalPath(), good, err)
		}
		good += nl + 1
	}
	if good < len(data) {
		if err := f.Truncate(int64(good)); err != nil {
			f.Close()
			return fmt.Errorf("%w: cut torn journal tail: %w", ErrState, err)
		}
	}
	if _, err := f.Seek(int64(good), io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	s.journal = f
	s.jbytes = int64(good)
	return nil
}

func (s *store) close() error {
	if s.journal == nil {
		return nil
	}
	err := s.journal.Close()
	s.journal = nil
	return err
}

// save persists every record that changed since the last save, with one
// write and one fsync.
func (s *store) save(st *state) error {
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
	if s.jbytes+int64(buf.Len()) > max(minCompact, 2*s.sbytes) {
		if err := s.compact(st); err != nil {
			return err
		}
		s.seen = next
		return nil
	}
	if err := s.appendJournal(buf.Bytes(), true); err != nil {
		return err
	}
	s.seen = next
	return nil
}

// faultAt is the test hook's verdict on one write (nil without a hook).
func (s *store) faultAt(op string) error {
	if s.fault == nil {
		return nil
	}
	return s.fault(op)
}

// appendJournal writes lines to the journal and, when sync, fsyncs it; on
// a failed write or sync it cuts what it wrote, so no half line is left for
// the next append and a record that was not acknowledged is not replayed.
// An unsynced append is an intent a crash of the process keeps (the page
// cache survives a kill -9) and a power loss may drop: only records whose
// loss reconcile repairs are written so (see persistIntent).
func (s *store) appendJournal(lines []byte, sync bool) error {
	cut := func(err error) error {
		s.journal.Truncate(s.jbytes)
		s.journal.Seek(s.jbytes, io.SeekStart)
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	if err := s.faultAt("journal.write"); err != nil {
		return cut(err)
	}
	if _, err := s.journal.Write(lines); err != nil {
		return cut(err)
	}
	if sync {
		if err := s.faultAt("journal.sync"); err != nil {
			return cut(err)
		}
		if err := s.journal.Sync(); err != nil {
			return cut(err)
		}
	}
	s.jbytes += int64(len(lines))
	return nil
}

// saveKeys is save for callers that know exactly which records they changed
// since the last save (keys "s/ID", "g/ID", "a/ID"): it costs those records,
// not the whole state. A record a caller changed but did not name would be
// lost on a crash, so only call sites that touch one known record use it.
func (s *store) saveKeys(st *state, keys ...string) error {
	return s.writeKeys(st, true, keys)
}

// writeKeys is saveKeys, with the journal fsynced only when sync.
func (s *store) writeKeys(st *state, sync bool, keys []string) error {
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
	if s.jbytes+int64(buf.Len()) > max(minCompact, 2*s.sbytes) {
		return s.save(st) // folds everything into a new snapshot
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

func (st *state) lookup(key string) (any, bool) {
	id := key[2:]
	switch key[0] {
	case 's':
		r, ok := st.Sessions[id]
		return r, ok
	case 'g':
		r, ok := st.Grants[id]
		return r, ok
	case 'a':
		r, ok := st.Approvals[id]
		return r, ok
	case 'c':
		r, ok := st.Cards[id]
		return r, ok
	case 'p':
		r, ok := st.Patterns[id]
		return r, ok
	}
	return nil, false
}

// compact writes a fresh snapshot, then empties the journal.
func (s *store) compact(st *state) error {
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrState, err)
	}
	if err := s.faultAt("snapshot"); err != nil {
		return fmt.Errorf("%w: snapshot: %w", ErrState, err)
	}
	if err := writeFileAtomic(s.path(), data, 0o600); err != nil {
		return err
	}
	s.sbytes = int64(len(data))
	if err := s.journal.Truncate(0); err != nil {
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	if _, err := s.journal.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	if err := s.journal.Sync(); err != nil {
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	s.jbytes = 0
	return nil
}

type keyedRecord struct {
	key string // "s/ID", "g/ID", "a/ID"
	v   any
}

func (st *state) records() []keyedRecord {
	out := make([]keyedRecord, 0, len(st.Sessions)+len(st.Grants)+len(st.Approvals))
	for id, r := range st.Sessions {
		out = append(out, keyedRecord{"s/" + id, r})
	}
	for id, r := range st.Grants {
		out = append(out, keyedRecord{"g/" + id, r})
	}
	for id, r := range st.Approvals {
		out = append(out, keyedRecord{"a/" + id, r})
	}
	for id, r := range st.Cards {
		out = append(out, keyedRecord{"c/" + id, r})
	}
	for id, r := range st.Patterns {
		out = append(out, keyedRecord{"p/" + id, r})
	}
	return out
}

func (st *state) fillMaps() {
	if st.Sessions == nil {
		st.Sessions = map[string]*SessionRecord{}
	}
	if st.Grants == nil {
		st.Grants = map[string]*GrantRecord{}
	}
	if st.Approvals == nil {
		st.Approvals = map[string]*ApprovalRecord{}
	}
	if st.Cards == nil {
		st.Cards = map[string]*Card{}
	}
	if st.Patterns == nil {
		st.Patterns = map[string]*Pattern{}
	}
}

func (st *state) apply(jl journalLine) error {
	switch jl.Kind {
	case "s":
		if jl.Del {
			delete(st.Sessions, jl.ID)
			return nil
		}
		var r SessionRecord
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Sessions[jl.ID] = &r
	case "g":
		if jl.Del {
			delete(st.Grants, jl.ID)
			return nil
		}
		var r GrantRecord
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Grants[jl.ID] = &r
	case "a":
		if jl.Del {
			delete(st.Approvals, jl.ID)
			return nil
		}
		var r ApprovalRecord
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Approvals[jl.ID] = &r
	case "c":
		if jl.Del {
			delete(st.Cards, jl.ID)
			return nil
		}
		var r Card
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Cards[jl.ID] = &r
	case "p":
		if jl.Del {
			delete(st.Patterns, jl.ID)
			return nil
		}
		var r Pattern
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Patterns[jl.ID] = &r
	default:
		return fmt.Errorf("unknown record kind %q", jl.Kind)
	}
	return nil
}

func hashBytes(b []byte) [32]byte { return sha256.Sum256(b) }

// writeFileAtomic replaces path atomically (atomicfile.Write), errors
// wrapped in ErrState.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := atomicfile.Write(path, data, mode); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	return nil
}

// loadOrCreateKey returns the handle MAC key, creating it on first start.
func loadOrCreateKey(dir string) ([]byte, error) {
	p := filepath.Join(dir, "handle.key")
	key, err := os.ReadFile(p)
	if err == nil {
		if len(key) != 32 {
			return nil, fmt.Errorf("%w: %s: want 32 bytes, have %d", ErrState, p, len(key))
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	if err := writeFileAtomic(p, key, 0o600); err != nil {
		return nil, err
	}
	return key, nil
}
