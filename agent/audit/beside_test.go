package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// CommitBeside: the caller's work (the agent's journal write of a live
// grant) runs beside the log's fdatasync, told the batch's last seq; the
// seq a reopened log starts from (OpenedHead) says whether the batch
// survived.

// TestCommitBeside: then gets the batch's last seq while the records are
// in the file; once CommitBeside has returned, the checkpoint (written
// after it) vouches for that seq and the log verifies with no note; then's
// error is returned.
func TestCommitBeside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, LogFile)
	l := openLog(t, dir)
	l.Write(Event{Type: EventRequest, Session: "s1"})
	r2, err := l.Write(Event{Type: EventGrant, Session: "s1", Outcome: "live"})
	if err != nil {
		t.Fatal(err)
	}
	var got uint64
	var gotHash string
	if err := l.CommitBeside(func(seq uint64, hash string) error {
		got, gotHash = seq, hash
		if n := len(readLines(t, path)); n != int(r2.Seq) {
			t.Errorf("then: the log holds %d records, want %d", n, r2.Seq)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if h2, _ := r2.Hash(); got != r2.Seq || gotHash != h2 {
		t.Fatalf("then was told seq %d hash %s, want the batch's last %d %s", got, gotHash, r2.Seq, h2)
	}
	mustCheckpoint(t, l)
	seqs := slotSeqs(t, CheckpointPath(path), l.PublicKey())
	if seqs[0] != int64(r2.Seq) && seqs[1] != int64(r2.Seq) {
		t.Fatalf("checkpoint slots %v: none vouches for the batch's last seq %d", seqs, r2.Seq)
	}
	boom := errors.New("journal: no space left on device")
	l.Write(Event{Type: EventGrant, Session: "s1"})
	if err := l.CommitBeside(func(uint64, string) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("then failing: %v, want its error", err)
	}
	head, _ := l.Head()
	l.Close()
	if rep := mustVerify(t, dir); !rep.OK() || len(rep.Notes) != 0 || rep.Head != head {
		t.Fatalf("verify: head %d of %d, problems %v, notes %v", rep.Head, head, rep.Problems, rep.Notes)
	}
	l2 := openLog(t, dir)
	defer l2.Close()
	if o := l2.OpenedHead(); o != head {
		t.Fatalf("OpenedHead %d after a clean close at %d", o, head)
	}
}

// TestCommitBesideFailedLog: a log that has already failed does not call
// then (nothing to write beside records it cannot make durable).
func TestCommitBesideFailedLog(t *testing.T) {
	l := openLog(t, t.TempDir())
	defer l.Close()
	l.Write(Event{Type: EventRequest, Session: "s1"})
	l.mu.Lock()
	l.failed = errors.New("input/output error")
	l.mu.Unlock()
	called := false
	if err := l.CommitBeside(func(uint64, string) error { called = true; return nil }); !errors.Is(err, ErrFailed) || called {
		t.Fatalf("CommitBeside on a failed log: %v, then called %v; want ErrFailed and no call", err, called)
	}
}

// TestCommitBesideLostBatch: what a power loss while both syncs ran can
// leave: the caller's write kept, the batch lost (the log cut back to
// before it, the checkpoint as it was, since its slot is written only
// after the log's fdatasync). The reopened log verifies, and OpenedHead
// is below the seq then was given, which is how the agent knows.
func TestCommitBesideLostBatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, LogFile)
	cp := CheckpointPath(path)
	l := openLog(t, dir)
	before := mustAppend(t, l, Event{Type: EventSessionCreate, Session: "s1"})
	mustCheckpoint(t, l)
	oldCP, err := os.ReadFile(cp)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(Event{Type: EventRequest, Session: "s1"})
	l.Write(Event{Type: EventGrant, Session: "s1"})
	var mark uint64
	var markHash string
	if err := l.CommitBeside(func(seq uint64, hash string) error { mark, markHash = seq, hash; return nil }); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := os.Truncate(path, st.Size()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cp, oldCP, 0o600); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, dir)
	defer l2.Close()
	if o := l2.OpenedHead(); o != before.Seq || o >= mark {
		t.Fatalf("OpenedHead %d after the batch up to %d was lost, want %d", o, mark, before.Seq)
	}
	if rep := mustVerify(t, dir); !rep.OK() || rep.Head != before.Seq {
		t.Fatalf("verify: head %d, problems %v", rep.Head, rep.Problems)
	}
	// The log reaches the mark's seq again with other records: the lost
	// record is still not there (its hash names it, not its seq).
	for range mark - before.Seq {
		mustAppend(t, l2, Event{Type: EventAgentStart})
	}
	if h, ok, err := l2.RecordHash(mark); err != nil || !ok || h == markHash {
		t.Fatalf("RecordHash(%d) after other records took the lost seq: %q %v %v, want a hash other than the lost record's", mark, h, ok, err)
	}
}

// TestRecordHash: the hash of the record at any seq, read from the end
// back across chunk boundaries (records of varied length); none for seq 0
// or beyond the head; a line edited or dropped on the way is ErrCorrupt.
func TestRecordHash(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir)
	var want []string
	for i := range 300 {
		r, err := l.Write(Event{Type: EventDecision, Session: "s1", Reason: strings.Repeat("x", i%7*97)})
		if err != nil {
			t.Fatal(err)
		}
		h, _ := r.Hash()
		want = append(want, h)
	}
	if err := l.Commit(nil); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(l.Path()); err != nil || st.Size() < 2*64<<10 {
		t.Fatalf("the log is %v bytes (%v): want it across more than one read", st.Size(), err)
	}
	for seq := uint64(len(want)); seq >= 1; seq -= min(seq, 7) {
		if h, ok, err := l.RecordHash(seq); err != nil || !ok || h != want[seq-1] {
			t.Fatalf("RecordHash(%d): %q %v %v, want %q", seq, h, ok, err, want[seq-1])
		}
	}
	for _, seq := range []uint64{0, uint64(len(want)) + 1} {
		if h, ok, err := l.RecordHash(seq); err != nil || ok || h != "" {
			t.Fatalf("RecordHash(%d) of a log of %d records: %q %v %v, want none", seq, len(want), h, ok, err)
		}
	}
	l.Close()
	path := filepath.Join(dir, LogFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A record dropped on the way, every line left signed: the chain
	// breaks (the dropped record's successor names it).
	lines := bytes.SplitAfter(data, []byte("\n"))
	dropped := slices.Concat(lines[:len(want)-5], lines[len(want)-4:])
	if err := os.WriteFile(path, bytes.Join(dropped, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, dir)
	if h, ok, err := l2.RecordHash(uint64(len(want)) - 2); err != nil || !ok || h != want[len(want)-3] {
		t.Fatalf("RecordHash after the drop, before the dropped line: %q %v %v", h, ok, err)
	}
	if _, _, err := l2.RecordHash(uint64(len(want)) - 6); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("RecordHash across a dropped line: %v, want ErrCorrupt", err)
	}
	l2.Close()
	lines[len(want)-3] = bytes.Replace(lines[len(want)-3], []byte(`"s1"`), []byte(`"s2"`), 1)
	if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	l2 = openLog(t, dir)
	defer l2.Close()
	if _, _, err := l2.RecordHash(uint64(len(want)) - 1); err != nil {
		t.Fatalf("RecordHash after the edit, before the edited line: %v", err)
	}
	if _, _, err := l2.RecordHash(uint64(len(want)) - 3); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("RecordHash across an edited line: %v, want ErrCorrupt", err)
	}
	l2.Close()
	if _, _, err := l2.RecordHash(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("RecordHash on a closed log: %v, want ErrClosed", err)
	}
}

// TestCommitBesideSyncFails: the log's fdatasync fails (its descriptor
// closed under it: EBADF) while then runs: then's work is done, the error
// is ErrFailed, no checkpoint vouches for the batch, and the log refuses
// further records, so the caller must undo what then wrote.
func TestCommitBesideSyncFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, LogFile)
	l := openLog(t, dir)
	mustAppend(t, l, Event{Type: EventSessionCreate, Session: "s1"})
	mustCheckpoint(t, l)
	before := slotSeqs(t, CheckpointPath(path), l.PublicKey())
	l.Write(Event{Type: EventGrant, Session: "s1"})
	l.f.Close()
	called := false
	err := l.CommitBeside(func(uint64, string) error { called = true; return nil })
	if !errors.Is(err, ErrFailed) || !called {
		t.Fatalf("CommitBeside with a failing sync: %v, then called %v; want ErrFailed after then ran", err, called)
	}
	if got := slotSeqs(t, CheckpointPath(path), l.PublicKey()); got != before {
		t.Fatalf("checkpoint moved to %v (was %v) over a batch that was not made durable", got, before)
	}
	if _, err := l.Write(Event{Type: EventGrant}); !errors.Is(err, ErrFailed) {
		t.Fatalf("write after the failed sync: %v, want ErrFailed", err)
	}
}
