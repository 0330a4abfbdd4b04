package audit

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The checkpoint trails the log: Append, AppendBatch, Commit and
// CommitBeside return once their records are durable; one writer then
// writes the checkpoint of the newest durable head, and Checkpointed and
// Close wait for it.

// TestCommitBeforeCheckpoint: with the checkpoint writer held inside its
// slot write, Append, Commit (its then run) and CommitBeside return, and
// a second and third batch are durable; once the writer is let go, one
// more checkpoint covers all of them (coalesced: the writes are for the
// first head and the newest only), and the log verifies with no note.
func TestCommitBeforeCheckpoint(t *testing.T) {
	dir := t.TempDir()
	entered := make(chan uint64, 8)
	release := make(chan struct{})
	l, err := Open(Config{Dir: dir, cpHook: func(seq uint64) {
		entered <- seq
		<-release
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	defer let() // before Close, on a failure too
	first := make(chan error, 1)
	go func() { _, err := l.Append(Event{Type: EventSessionCreate, Session: "s1"}); first <- err }()
	// The Append's checkpoint is now being written and cannot finish.
	if seq := <-entered; seq != 1 {
		t.Fatalf("checkpoint write for seq %d, want 1", seq)
	}
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a guard against a hang, not a timing
		t.Fatal("Append did not return while its checkpoint's write was held")
	}
	l.Write(Event{Type: EventRequest, Session: "s1"})
	l.Write(Event{Type: EventGrant, Session: "s1"})
	thenRan := false
	if err := l.Commit(func() error { thenRan = true; return nil }); err != nil || !thenRan {
		t.Fatalf("Commit while the checkpoint is held: %v, then ran %v", err, thenRan)
	}
	l.Write(Event{Type: EventGrant, Session: "s1"})
	var mark uint64
	if err := l.CommitBeside(func(seq uint64, _ string) error { mark = seq; return nil }); err != nil {
		t.Fatal(err)
	}
	if mark != 4 {
		t.Fatalf("CommitBeside's mark %d, want 4", mark)
	}
	// All four records are durable, none of the three batches after the
	// first has a checkpoint yet: the slots hold the open's (seq 0) only.
	path := filepath.Join(dir, LogFile)
	if seqs := slotSeqs(t, CheckpointPath(path), l.PublicKey()); seqs[0] != 0 || seqs[1] != -1 {
		t.Fatalf("checkpoint slots %v while the writer is held, want [0 -1]", seqs)
	}
	done := make(chan error, 1)
	go func() { done <- l.Checkpointed() }()
	let()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if seq := <-entered; seq != 4 {
		t.Fatalf("second checkpoint write for seq %d, want 4 (the newest durable head)", seq)
	}
	if n := len(entered); n != 0 {
		t.Fatalf("%d more checkpoint writes, want the two", n)
	}
	if seqs := slotSeqs(t, CheckpointPath(path), l.PublicKey()); seqs != [2]int64{4, 1} {
		t.Fatalf("checkpoint slots %v, want [4 1] (slot 1 for seq 1, then slot 0)", seqs)
	}
	if rep := mustVerify(t, dir); !rep.OK() || len(rep.Notes) != 0 || rep.Head != 4 {
		t.Fatalf("verify: head %d, problems %v, notes %v", rep.Head, rep.Problems, rep.Notes)
	}
}

// TestCheckpointWriteFails: a checkpoint whose write fails (its file's
// descriptor closed under it: EBADF) after its records were durable and
// acknowledged fails the Log: it is logged, Checkpointed says so, further
// records are refused (ErrFailed), Close returns the error, and the
// records stay:
// the reopened log, ahead of its checkpoint, vouches for them.
func TestCheckpointWriteFails(t *testing.T) {
	dir := t.TempDir()
	var logged bytes.Buffer
	l, err := Open(Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, Event{Type: EventSessionCreate, Session: "s1"})
	mustCheckpoint(t, l)
	l.cpFile.Close()
	r := mustAppend(t, l, Event{Type: EventRequest, Session: "s1"}) // durable: acknowledged
	if err := l.Checkpointed(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Checkpointed after a failed checkpoint write: %v, want ErrFailed", err)
	}
	if _, err := l.Append(Event{Type: EventRequest, Session: "s1"}); !errors.Is(err, ErrFailed) {
		t.Fatalf("append after a failed checkpoint write: %v, want ErrFailed", err)
	}
	if !strings.Contains(logged.String(), "checkpoint failed") {
		t.Fatalf("the failure was not logged: %q", logged.String())
	}
	if err := l.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("close after a failed checkpoint write: %v, want ErrFailed", err)
	}
	reopenedClean(t, dir, r.Seq)
}

// reopenedClean: the log in dir reopens with its head at seq, and once
// reopened verifies with no problem and no note, its head at seq.
func reopenedClean(t *testing.T, dir string, seq uint64) {
	t.Helper()
	l := openLog(t, dir)
	if head, _ := l.Head(); head != seq {
		t.Fatalf("head after reopen %d, want %d", head, seq)
	}
	l.Close()
	if rep := mustVerify(t, dir); !rep.OK() || len(rep.Notes) != 0 || rep.Head != seq {
		t.Fatalf("after reopen: head %d, problems %v, notes %v", rep.Head, rep.Problems, rep.Notes)
	}
}
