package audit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The batched commit: records written with Write and made durable by one
// Commit (one fdatasync, then, trailing it, one checkpoint covering the last
// of them), with the caller's work (the agent's journal fsync) run once the
// records are durable.

// TestCommitBatch: two written records, one commit: then runs once both are
// in the file, the checkpoint (once written) vouches for the second, and
// the log verifies with no note.
func TestCommitBatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, LogFile)
	l := openLog(t, dir)
	before := slotSeqs(t, CheckpointPath(path), l.PublicKey())
	r1, err := l.Write(Event{Type: EventRequest, Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Write(Event{Type: EventGrant, Session: "s1", Outcome: "live"})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Seq != r1.Seq+1 {
		t.Fatalf("seqs %d, %d", r1.Seq, r2.Seq)
	}
	if got := slotSeqs(t, CheckpointPath(path), l.PublicKey()); got != before {
		t.Fatalf("Write moved the checkpoint: %v, was %v", got, before)
	}
	calls := 0
	if err := l.Commit(func() error {
		calls++
		// Ordered after the records: both are in the file.
		if n := len(readLines(t, path)); n != int(r2.Seq) {
			t.Errorf("then: the log holds %d records, want %d", n, r2.Seq)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("then called %d times", calls)
	}
	mustCheckpoint(t, l)
	seqs := slotSeqs(t, CheckpointPath(path), l.PublicKey())
	if seqs[0] != int64(r2.Seq) && seqs[1] != int64(r2.Seq) {
		t.Fatalf("checkpoint slots %v: none vouches for the batch's last seq %d", seqs, r2.Seq)
	}
	if seqs[0] == int64(r1.Seq) || seqs[1] == int64(r1.Seq) {
		t.Fatalf("checkpoint slots %v: one checkpoint per record, want one for the batch", seqs)
	}
	// A commit with nothing new still runs then, and writes no checkpoint.
	calls = 0
	if err := l.Commit(func() error { calls++; return nil }); err != nil || calls != 1 {
		t.Fatalf("empty commit: %v, then called %d times", err, calls)
	}
	mustCheckpoint(t, l)
	if got := slotSeqs(t, CheckpointPath(path), l.PublicKey()); got != seqs {
		t.Fatalf("empty commit moved the checkpoint: %v, was %v", got, seqs)
	}
	l.Close()
	if rep := mustVerify(t, dir); !rep.OK() || len(rep.Notes) != 0 || rep.Head != r2.Seq {
		t.Fatalf("verify: head %d, problems %v, notes %v", rep.Head, rep.Problems, rep.Notes)
	}
}

// TestCommitThenFails: then's error is Commit's; the records are durable and
// checkpointed all the same, and the log goes on.
func TestCommitThenFails(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir)
	r, err := l.Write(Event{Type: EventGrant, Outcome: "live"})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("journal: no space left on device")
	if err := l.Commit(func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("commit: %v, want then's error", err)
	}
	mustAppend(t, l, Event{Type: EventDecision, Outcome: "rolled back"})
	l.Close()
	if rep := mustVerify(t, dir); !rep.OK() || rep.Head != r.Seq+1 || len(rep.Notes) != 0 {
		t.Fatalf("verify: head %d, problems %v, notes %v", rep.Head, rep.Problems, rep.Notes)
	}
}

// TestCommitFailedLog: a failed log does not call then (its records could
// not be made durable) and refuses the commit.
func TestCommitFailedLog(t *testing.T) {
	l := openLog(t, t.TempDir())
	if _, err := l.Write(Event{Type: EventGrant}); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.failed = errors.New("injected: input/output error")
	l.mu.Unlock()
	called := false
	if err := l.Commit(func() error { called = true; return nil }); !errors.Is(err, ErrFailed) {
		t.Fatalf("commit on a failed log: %v, want ErrFailed", err)
	}
	if called {
		t.Fatal("then ran although the records are not durable")
	}
	if _, err := l.Write(Event{Type: EventGrant}); !errors.Is(err, ErrFailed) {
		t.Fatalf("write on a failed log: %v, want ErrFailed", err)
	}
}

// TestCommitCrashBeforeCheckpoint: a crash after the batch was durable and
// then had run (the journal fsynced) but before the checkpoint slot reached
// the disk leaves the log ahead of its checkpoint: Verify notes it, Open
// vouches for the records again, and every record of the batch is kept.
func TestCommitCrashBeforeCheckpoint(t *testing.T) {
	dir := t.TempDir()
	cp := CheckpointPath(filepath.Join(dir, LogFile))
	l := openLog(t, dir)
	mustAppend(t, l, Event{Type: EventSessionCreate, Session: "s1"})
	mustCheckpoint(t, l)
	old, err := os.ReadFile(cp)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(Event{Type: EventRequest, Session: "s1"})
	last, _ := l.Write(Event{Type: EventGrant, Session: "s1"})
	if err := l.Commit(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := os.WriteFile(cp, old, 0o600); err != nil { // the slot's write lost
		t.Fatal(err)
	}
	if rep := mustVerify(t, dir); !rep.OK() || len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "behind") {
		t.Fatalf("verify: problems %v, notes %v: want the lagging checkpoint noted", rep.Problems, rep.Notes)
	}
	reopenedClean(t, dir, last.Seq)
}

// TestCrashBetweenBatchedWrites: a process killed after Write and before
// Commit leaves the written records in the file (the page cache keeps them):
// Open checkpoints them and the log verifies. They were never acknowledged,
// so keeping them is the honest outcome (the agent's reconcile rolls back
// the grant whose live record was not written).
func TestCrashBetweenBatchedWrites(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, Event{Type: EventSessionCreate, Session: "s1"})
	w, err := l.Write(Event{Type: EventRequest, Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	// Abandoned, as a killed process leaves it (its descriptors closed).
	l.f.Close()
	l.cpFile.Close()
	l2 := openLog(t, dir)
	if seq, _ := l2.Head(); seq != w.Seq {
		t.Fatalf("head after reopen %d, want %d", seq, w.Seq)
	}
	l2.Close()
	if rep := mustVerify(t, dir); !rep.OK() || rep.Head != w.Seq {
		t.Fatalf("verify: head %d, problems %v", rep.Head, rep.Problems)
	}
}

// TestTruncatedBatch: cutting records of a committed batch from the tail is
// found, whether the last record or the whole batch goes (the checkpoint
// vouches for the batch's last seq): Open refuses, Verify names it.
func TestTruncatedBatch(t *testing.T) {
	for _, cut := range []int{1, 3} {
		dir := t.TempDir()
		path := filepath.Join(dir, LogFile)
		l := openLog(t, dir)
		mustAppend(t, l, Event{Type: EventSessionCreate, Session: "s1"})
		for i := 0; i < 3; i++ {
			if _, err := l.Write(Event{Type: EventRequest, Session: "s1"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Commit(nil); err != nil {
			t.Fatal(err)
		}
		l.Close()
		lines := readLines(t, path)
		keep := 0
		for _, ln := range lines[:len(lines)-cut] {
			keep += len(ln)
		}
		if err := os.Truncate(path, int64(keep)); err != nil {
			t.Fatal(err)
		}
		pub := l.PublicKey()
		rep, err := Verify(path, pub)
		if !errors.Is(err, ErrTampered) || rep == nil || rep.Problems[0].Kind != ProblemTruncated {
			t.Errorf("cut %d: verify %v, report %+v: want a truncated tail", cut, err, rep)
		}
		if _, err := Open(Config{Dir: dir}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("cut %d: open: %v, want ErrCorrupt", cut, err)
		}
	}
}

// BenchmarkBuild: sealing one grant.issue-like record (redaction of every
// field, canonical JSON, signature), without the file.
func BenchmarkBuild(b *testing.B) {
	l := openLog(&testing.T{}, b.TempDir())
	ev := Event{Type: EventGrant, Session: "s1234", Resource: "net.egress", Tier: "auto", Provenance: "agent", Outcome: "live",
		Handle: "0123456789abcdef0123456789abcdef", Params: []byte("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r, err := build(ev, l.cfg.now())
		if err != nil {
			b.Fatal(err)
		}
		r.Seq, r.PrevHash = 1, l.hash
		if _, _, err := seal(&r, l.priv); err != nil {
			b.Fatal(err)
		}
	}
}
