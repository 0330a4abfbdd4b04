package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/capability"
)

func openStore(t *testing.T, dir string) (*Store, *State) {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.State()
}

func sameState(t *testing.T, a, b *State) {
	t.Helper()
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatalf("state differs:\n%s\n%s", ja, jb)
	}
}

// TestStoreJournal: a save appends only what changed; reload gives the same
// state; a torn last line is dropped; a corrupt middle line is an error;
// compaction folds the journal into the snapshot.
func TestStoreJournal(t *testing.T) {
	dir := t.TempDir()
	s, st := openStore(t, dir)
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 50; i++ {
		st.Sessions[fmt.Sprint("s", i)] = &SessionRecord{Spec: capability.SessionSpec{ID: fmt.Sprint("s", i), Image: "py"}, Phase: SessionActive, Created: now}
	}
	if err := s.WriteAll(); err != nil {
		t.Fatal(err)
	}
	size1 := s.jbytes
	// One change appends one line.
	st.Sessions["s7"].Phase = SessionEnding
	delete(st.Sessions, "s8")
	if err := s.WriteAll(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(s.journalPath())
	tail := string(data[size1:])
	if n := strings.Count(tail, "\n"); n != 2 || !strings.Contains(tail, `"s7"`) || !strings.Contains(tail, `"del":true`) {
		t.Fatalf("second save appended %d lines: %q", n, tail)
	}
	if err := s.WriteAll(); err != nil || s.jbytes != int64(len(data)) {
		t.Fatalf("an unchanged save wrote: %v, %d -> %d", err, len(data), s.jbytes)
	}
	s.Close()

	t.Run("reload", func(t *testing.T) {
		_, st2 := openStore(t, dir)
		sameState(t, st, st2)
	})
	t.Run("torn last line is dropped", func(t *testing.T) {
		f, _ := os.OpenFile(s.journalPath(), os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString(`{"k":"s","id":"s9","v":{"spec":`)
		f.Close()
		s2, st2 := openStore(t, dir)
		sameState(t, st, st2)
		if fi, _ := os.Stat(s.journalPath()); fi.Size() != int64(len(data)) {
			t.Errorf("torn tail not cut: %d bytes, want %d", fi.Size(), len(data))
		}
		// And appending goes on from the good end.
		st2.Sessions["s9"].Phase = SessionEnding
		if err := s2.WriteAll(); err != nil {
			t.Fatal(err)
		}
		s2.Close()
		_, st3 := openStore(t, dir)
		if st3.Sessions["s9"].Phase != SessionEnding {
			t.Errorf("append after a cut tail was lost")
		}
		st = st3
	})
	t.Run("corrupt middle line is an error", func(t *testing.T) {
		d2 := t.TempDir()
		raw, _ := os.ReadFile(s.journalPath())
		lines := strings.SplitAfter(string(raw), "\n")
		lines[1] = "garbage\n"
		os.WriteFile(d2+"/state.journal", []byte(strings.Join(lines, "")), 0o600)
		if _, err := Open(d2); !errors.Is(err, ErrState) {
			t.Fatalf("corrupt journal: %v, want ErrState", err)
		}
	})
	t.Run("compaction", func(t *testing.T) {
		s4, st4 := openStore(t, dir)
		if err := s4.compact(st4); err != nil {
			t.Fatal(err)
		}
		if s4.jbytes != 0 {
			t.Fatalf("journal not emptied")
		}
		s4.Close()
		_, st5 := openStore(t, dir)
		sameState(t, st4, st5)
		if !reflect.DeepEqual(len(st5.Sessions), len(st.Sessions)) {
			t.Fatalf("sessions %d, want %d", len(st5.Sessions), len(st.Sessions))
		}
	})
}

// TestStoreWriteKeys: naming the changed records persists exactly them.
func TestStoreWriteKeys(t *testing.T) {
	dir := t.TempDir()
	s, st := openStore(t, dir)
	st.Sessions["a"] = &SessionRecord{Spec: capability.SessionSpec{ID: "a", Image: "py"}, Phase: SessionCreating}
	if err := s.Write([]string{SessionKey("a")}, true); err != nil {
		t.Fatal(err)
	}
	st.Sessions["a"].Phase = SessionActive
	if err := s.Write([]string{SessionKey("a")}, true); err != nil {
		t.Fatal(err)
	}
	delete(st.Sessions, "a")
	st.Sessions["b"] = &SessionRecord{Spec: capability.SessionSpec{ID: "b", Image: "py"}, Phase: SessionActive}
	if err := s.Write([]string{SessionKey("a"), SessionKey("b")}, true); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, st2 := openStore(t, dir)
	sameState(t, st, st2)
	// And a full save afterwards finds nothing left to write.
	s3, _ := openStore(t, dir)
	before := s3.jbytes
	if err := s3.WriteAll(); err != nil || s3.jbytes != before {
		t.Fatalf("full save after keyed saves wrote %d bytes (%v)", s3.jbytes-before, err)
	}
}
