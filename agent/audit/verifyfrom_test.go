package audit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestVerifyFrom: incremental verification from the mark of an earlier
// report that was OK checks only what was appended after it: an edit
// before the mark is not read again (a full Verify still finds it), while
// an edited or forged record after it, a rewritten mark record and a cut
// tail are each found.
func TestVerifyFrom(t *testing.T) {
	setup := func(t *testing.T) (dir, path string, l *Log, m Mark) {
		dir = t.TempDir()
		l = openLog(t, dir)
		evs := make([]Event, 1000)
		for i := range evs {
			evs[i] = Event{Type: EventKernelDenial, Session: fmt.Sprintf("s%d", i%7), Reason: "no_rule", Resource: "tcp 192.0.2.0/24", Count: uint64(i + 1)}
		}
		if err := l.AppendBatch(evs); err != nil {
			t.Fatal(err)
		}
		mustCheckpoint(t, l)
		rep := mustVerify(t, dir)
		if rep.Mark.Records != rep.Records || rep.Mark.Seq != rep.Head || rep.Mark.Hash != rep.HeadHash {
			t.Fatalf("mark %+v of report %+v", rep.Mark, rep)
		}
		for i := range 10 {
			mustAppend(t, l, Event{Type: EventDecision, Session: "s1", Outcome: "allow", RuleID: fmt.Sprint(i)})
		}
		mustCheckpoint(t, l)
		return dir, filepath.Join(dir, LogFile), l, rep.Mark
	}
	pubOf := func(t *testing.T, dir string) []byte {
		pub, err := LoadPublicKey(filepath.Join(dir, PubFile))
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	// rewrite replaces line i (0-based) of the log by f(line).
	rewrite := func(t *testing.T, path string, i int, f func([]byte) []byte) {
		lines := readLines(t, path)
		lines[i] = f(lines[i])
		if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("appended records verify from the mark", func(t *testing.T) {
		dir, path, _, m := setup(t)
		rep, err := VerifyFrom(path, pubOf(t, dir), m)
		if err != nil {
			t.Fatal(err)
		}
		full := mustVerify(t, dir)
		if rep.Records != full.Records || rep.Head != full.Head || rep.HeadHash != full.HeadHash || rep.Mark != full.Mark {
			t.Fatalf("incremental %+v, full %+v", rep, full)
		}
		// And again from the new mark: nothing new, still OK.
		if _, err := VerifyFrom(path, pubOf(t, dir), rep.Mark); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an edit before the mark is left to the full verify", func(t *testing.T) {
		dir, path, _, m := setup(t)
		rewrite(t, path, 10, func(b []byte) []byte { return bytes.Replace(b, []byte("no_rule"), []byte("no_rulf"), 1) })
		if _, err := VerifyFrom(path, pubOf(t, dir), m); err != nil {
			t.Fatalf("incremental read before its mark: %v", err)
		}
		rep, err := Verify(path, pubOf(t, dir))
		if !errors.Is(err, ErrTampered) || rep.Problems[0].Record != 11 || rep.Problems[0].Kind != ProblemSignature {
			t.Fatalf("full verify: %v", err)
		}
	})
	t.Run("an edit after the mark", func(t *testing.T) {
		dir, path, _, m := setup(t)
		rewrite(t, path, 1005, func(b []byte) []byte { return bytes.Replace(b, []byte(`"allow"`), []byte(`"allOw"`), 1) })
		rep, err := VerifyFrom(path, pubOf(t, dir), m)
		if !errors.Is(err, ErrTampered) || rep.Problems[0].Record != 1006 || rep.Problems[0].Kind != ProblemSignature {
			t.Fatalf("%v", err)
		}
	})
	t.Run("the mark record rewritten: verified in full, the edit named", func(t *testing.T) {
		dir, path, _, m := setup(t)
		rewrite(t, path, 999, func(b []byte) []byte { return bytes.Replace(b, []byte("no_rule"), []byte("no_rulf"), 1) })
		rep, err := VerifyFrom(path, pubOf(t, dir), m)
		if !errors.Is(err, ErrTampered) || rep.Problems[0].Kind != ProblemSignature || rep.Problems[0].Record != 1000 {
			t.Fatalf("%v", err)
		}
	})
	t.Run("a byte added before the mark: verified in full, the edit named", func(t *testing.T) {
		dir, path, _, m := setup(t)
		rewrite(t, path, 10, func(b []byte) []byte { return bytes.Replace(b, []byte(`"seq":`), []byte(`"seq": `), 1) })
		rep, err := VerifyFrom(path, pubOf(t, dir), m)
		if !errors.Is(err, ErrTampered) || rep.Problems[0].Record != 11 {
			t.Fatalf("%v", err)
		}
	})
	t.Run("the tail cut", func(t *testing.T) {
		dir, path, l, m := setup(t)
		l.Close()
		lines := readLines(t, path)
		if err := os.WriteFile(path, bytes.Join(lines[:1005], nil), 0o600); err != nil {
			t.Fatal(err)
		}
		rep, err := VerifyFrom(path, pubOf(t, dir), m)
		if !errors.Is(err, ErrTampered) || rep.Problems[0].Kind != ProblemTruncated {
			t.Fatalf("%v %+v", err, rep)
		}
	})
	t.Run("the log cut before the mark", func(t *testing.T) {
		dir, path, l, m := setup(t)
		l.Close()
		lines := readLines(t, path)
		if err := os.WriteFile(path, bytes.Join(lines[:500], nil), 0o600); err != nil {
			t.Fatal(err)
		}
		rep, err := VerifyFrom(path, pubOf(t, dir), m)
		if !errors.Is(err, ErrTampered) || rep.Problems[0].Kind != ProblemTruncated {
			t.Fatalf("%v %+v", err, rep)
		}
	})
}
