package store

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/agent/capability"
)

// recorder is a Fault hook safe for the fold's goroutine: it records every
// write asked about and fails those in fail with errno.
type recorder struct {
	mu    sync.Mutex
	asked []string
	fail  map[string]error
}

func (r *recorder) hook(op string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, op)
	return r.fail[op]
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.asked
	r.asked = nil
	return out
}

func session(id string, phase SessionPhase) *SessionRecord {
	return &SessionRecord{Spec: capability.SessionSpec{ID: id, Image: "py"}, Phase: phase}
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func snapshotThrough(t *testing.T, dir string) uint64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st.Through
}

// TestStoreRotate: a write that would take the journal past max(1 MiB,
// twice the snapshot) rotates it to a segment and appends to a fresh one;
// the fold then makes a snapshot through that segment, on its own
// goroutine, and removes the segment; a reopened store has every record.
// Below the bound nothing rotates.
func TestStoreRotate(t *testing.T) {
	dir := t.TempDir()
	s, st := openStore(t, dir)
	st.Sessions["a"] = session("a", SessionActive)
	st.Sessions["b"] = session("b", SessionActive)
	if err := s.Write([]string{SessionKey("a"), SessionKey("b")}, true); err != nil {
		t.Fatal(err)
	}
	var folds []Fold
	var fmu sync.Mutex
	s.OnFold = func(f Fold) { fmu.Lock(); folds = append(folds, f); fmu.Unlock() }
	rec := &recorder{}
	s.Fault = rec.hook
	s.jbytes = minCompact // as if the journal had grown to the bound
	st.Sessions["a"].Phase = SessionEnding
	if err := s.Write([]string{SessionKey("a")}, false); err != nil {
		t.Fatal(err)
	}
	s.waitFold()
	// The fold starts on its goroutine before the append, so its snapshot
	// may be asked before or after the append's write.
	got := rec.take()
	if len(got) != 3 || got[0] != FaultRotate || !slices.Contains(got, FaultJournalWrite) || !slices.Contains(got, FaultSnapshot) {
		t.Fatalf("over the bound: asked %v, want a rotation, then the append and the fold's snapshot", got)
	}
	if s.seg != 1 || len(folds) != 1 || folds[0].Err != nil || folds[0].Through != 1 || folds[0].Bytes != s.sbytes.Load() {
		t.Fatalf("segment %d, folds %+v, snapshot %d bytes", s.seg, folds, s.sbytes.Load())
	}
	if got := files(t, dir); !slices.Equal(got, []string{"state.journal", "state.json"}) {
		t.Fatalf("files after the fold: %v", got)
	}
	if n := snapshotThrough(t, dir); n != 1 {
		t.Fatalf("snapshot through %d, want 1", n)
	}
	// The fresh journal holds the rotating write's line alone.
	j, _ := os.ReadFile(s.journalPath())
	var jl journalLine
	if err := json.Unmarshal(j, &jl); err != nil || jl.ID != "a" || int64(len(j)) != s.jbytes {
		t.Fatalf("fresh journal %q (%v)", j, err)
	}
	s.Close()
	s2, st2 := openStore(t, dir)
	if st2.Sessions["a"].Phase != SessionEnding || st2.Sessions["b"] == nil || s2.seg != 1 {
		t.Fatalf("reopened: %+v %+v, segment %d", st2.Sessions["a"], st2.Sessions["b"], s2.seg)
	}
	// Below the bound nothing rotates: 2 × a snapshot over 1 MiB is it.
	s2.sbytes.Store(minCompact)
	s2.jbytes = minCompact
	st2.Sessions["a"].Phase = SessionActive
	rec2 := &recorder{}
	s2.Fault = rec2.hook
	if err := s2.Write([]string{SessionKey("a")}, true); err != nil {
		t.Fatal(err)
	}
	if got := rec2.take(); !slices.Equal(got, []string{FaultJournalWrite, FaultJournalSync}) {
		t.Fatalf("below twice the snapshot: asked %v, want an append", got)
	}
}

// TestStoreFoldDoesNotBlockWrites: while a fold runs (held in its snapshot
// write here), writes go on, and none rotates again.
func TestStoreFoldDoesNotBlockWrites(t *testing.T) {
	dir := t.TempDir()
	s, st := openStore(t, dir)
	st.Sessions["a"] = session("a", SessionActive)
	if err := s.Write([]string{SessionKey("a")}, true); err != nil {
		t.Fatal(err)
	}
	hold, held := make(chan struct{}), make(chan struct{})
	s.Fault = func(op string) error {
		if op == FaultSnapshot {
			close(held)
			<-hold
		}
		return nil
	}
	s.jbytes = minCompact
	st.Sessions["a"].Phase = SessionEnding
	if err := s.Write([]string{SessionKey("a")}, true); err != nil {
		t.Fatal(err)
	}
	<-held
	for i := 0; i < 20; i++ {
		s.jbytes = minCompact // over the bound again: no second rotation while the fold runs
		st.Sessions["a"].Breaker.Consecutive = i + 1
		if err := s.Write([]string{SessionKey("a")}, true); err != nil {
			t.Fatal(err)
		}
	}
	if s.seg != 1 {
		t.Fatalf("rotated to segment %d while a fold ran", s.seg)
	}
	close(hold)
	s.waitFold()
	s.Close()
	_, st2 := openStore(t, dir)
	if st2.Sessions["a"].Breaker.Consecutive != 20 || st2.Sessions["a"].Phase != SessionEnding {
		t.Fatalf("reopened: %+v", st2.Sessions["a"])
	}
}

// TestStoreFoldFault: a fold whose snapshot fails (ENOSPC, EIO) is
// reported, fails no write and loses nothing: its segment stays and is
// replayed at Open, and the next rotation's fold folds both segments.
func TestStoreFoldFault(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EIO} {
		t.Run(errno.Error(), func(t *testing.T) {
			dir := t.TempDir()
			s, st := openStore(t, dir)
			var folds []Fold
			var fmu sync.Mutex
			s.OnFold = func(f Fold) { fmu.Lock(); folds = append(folds, f); fmu.Unlock() }
			rec := &recorder{fail: map[string]error{FaultSnapshot: errno}}
			s.Fault = rec.hook
			st.Sessions["a"] = session("a", SessionActive)
			s.jbytes = minCompact
			if err := s.Write([]string{SessionKey("a")}, true); err != nil {
				t.Fatalf("a failing fold failed the write: %v", err)
			}
			s.waitFold()
			if len(folds) != 1 || !errors.Is(folds[0].Err, errno) || !errors.Is(folds[0].Err, ErrState) {
				t.Fatalf("folds %+v, want one failed with %v", folds, errno)
			}
			if got := files(t, dir); !slices.Equal(got, []string{"state.journal", "state.journal.1"}) {
				t.Fatalf("files after a failed fold: %v", got)
			}
			st.Sessions["b"] = session("b", SessionActive)
			if err := s.Write([]string{SessionKey("b")}, true); err != nil {
				t.Fatal(err)
			}
			s.Close()
			s2, st2 := openStore(t, dir)
			if st2.Sessions["a"] == nil || st2.Sessions["b"] == nil || s2.seg != 1 {
				t.Fatalf("reopened after a failed fold: %v, segment %d", st2.Sessions, s2.seg)
			}
			s2.jbytes = minCompact
			st2.Sessions["c"] = session("c", SessionActive)
			if err := s2.Write([]string{SessionKey("c")}, true); err != nil {
				t.Fatal(err)
			}
			s2.waitFold()
			if got := files(t, dir); !slices.Equal(got, []string{"state.journal", "state.json"}) || snapshotThrough(t, dir) != 2 {
				t.Fatalf("files after the next fold: %v", got)
			}
			s2.Close()
			_, st3 := openStore(t, dir)
			if len(st3.Sessions) != 3 {
				t.Fatalf("reopened: %v", st3.Sessions)
			}
		})
	}
}

// TestStoreRotateFault: a rotation that cannot be made (its sync, the
// fresh file, the rename) is reported and the write appends to the journal
// as it was; nothing is lost.
func TestStoreRotateFault(t *testing.T) {
	dir := t.TempDir()
	s, st := openStore(t, dir)
	var folds []Fold
	s.OnFold = func(f Fold) { folds = append(folds, f) }
	s.Fault = (&recorder{fail: map[string]error{FaultRotate: syscall.ENOSPC}}).hook
	st.Sessions["a"] = session("a", SessionActive)
	s.jbytes = minCompact
	if err := s.Write([]string{SessionKey("a")}, true); err != nil {
		t.Fatalf("a failed rotation failed the write: %v", err)
	}
	if len(folds) != 1 || folds[0].Through != 0 || !errors.Is(folds[0].Err, syscall.ENOSPC) || s.seg != 0 {
		t.Fatalf("folds %+v, segment %d", folds, s.seg)
	}
	if got := files(t, dir); !slices.Equal(got, []string{"state.journal"}) {
		t.Fatalf("files: %v", got)
	}
	s.Close()
	if _, st2 := openStore(t, dir); st2.Sessions["a"] == nil {
		t.Fatal("the write was lost")
	}
}

// TestStoreOpenSegments: Open replays the segments above the snapshot's
// "through" in order, before the journal, and removes those at or below it
// (a fold ended before their removal: replaying them would bring back
// records the snapshot has since changed) and a rotation's leftover.
func TestStoreOpenSegments(t *testing.T) {
	dir := t.TempDir()
	line := func(id string, phase SessionPhase) string {
		b, _ := json.Marshal(session(id, phase))
		l, _ := json.Marshal(journalLine{Kind: "s", ID: id, Rec: b})
		return string(l) + "\n"
	}
	snap, _ := json.Marshal(&State{Version: stateVersion, Through: 2, Sessions: map[string]*SessionRecord{"a": session("a", SessionActive)}})
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("state.json", string(snap))
	write("state.journal.1", line("a", SessionCreating)) // folded: stale
	write("state.journal.2", line("a", SessionCreating)+line("z", SessionActive))
	write("state.journal.3", line("b", SessionCreating))
	write("state.journal.10", line("b", SessionEnding)) // after 3, not before
	write("state.journal", line("c", SessionActive))
	write("state.journal.next", "")
	s, st := openStore(t, dir)
	if st.Sessions["a"].Phase != SessionActive || st.Sessions["z"] != nil || st.Sessions["b"].Phase != SessionEnding || st.Sessions["c"] == nil {
		t.Fatalf("loaded %+v", st.Sessions)
	}
	if s.seg != 10 {
		t.Fatalf("segment %d, want 10", s.seg)
	}
	if got := files(t, dir); !slices.Equal(got, []string{"state.journal", "state.journal.10", "state.journal.3", "state.json"}) {
		t.Fatalf("files after Open: %v", got)
	}
	// A corrupt line inside a segment refuses to load, as in the journal.
	write("state.journal.3", "garbage\n"+line("b", SessionActive))
	s.Close()
	if _, err := Open(dir); !errors.Is(err, ErrState) {
		t.Fatalf("corrupt segment: %v, want ErrState", err)
	}
}
