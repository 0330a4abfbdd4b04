package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/agent/capability"
)

// TestStoreFault: a write the Fault hook fails returns an error wrapping
// ErrState and the errno, leaves the journal on disk as it was (no half
// line), and is not taken as written: the same Write once the disk works
// writes the record. An unsynced Write asks about the write only.
func TestStoreFault(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EIO} {
		for _, at := range []string{FaultJournalWrite, FaultJournalSync} {
			t.Run(errno.Error()+"/"+at, func(t *testing.T) {
				dir := t.TempDir()
				s, st := openStore(t, dir)
				st.Sessions["a"] = &SessionRecord{Spec: capability.SessionSpec{ID: "a", Image: "py"}, Phase: SessionActive}
				if err := s.Write([]string{SessionKey("a")}, true); err != nil {
					t.Fatal(err)
				}
				before, _ := os.ReadFile(s.journalPath())
				st.Sessions["a"].Phase = SessionEnding
				var asked []string
				s.Fault = func(op string) error {
					asked = append(asked, op)
					if op == at {
						return errno
					}
					return nil
				}
				err := s.Write([]string{SessionKey("a")}, true)
				if !errors.Is(err, ErrState) || !errors.Is(err, errno) {
					t.Fatalf("err %v, want ErrState wrapping %v", err, errno)
				}
				if want := []string{FaultJournalWrite, FaultJournalSync}[:len(asked)]; len(asked) == 0 || !slices.Equal(asked, want) || asked[len(asked)-1] != at {
					t.Fatalf("asked %v, failing %s", asked, at)
				}
				if after, _ := os.ReadFile(s.journalPath()); string(after) != string(before) || s.jbytes != int64(len(before)) {
					t.Fatalf("a failed write left the journal changed: %d bytes, %d before (jbytes %d)", len(after), len(before), s.jbytes)
				}
				s.Fault = nil
				if err := s.Write([]string{SessionKey("a")}, true); err != nil {
					t.Fatal(err)
				}
				s.Close()
				if _, st2 := openStore(t, dir); st2.Sessions["a"].Phase != SessionEnding {
					t.Fatalf("the retried write was not persisted")
				}
			})
		}
	}
	t.Run("unsynced", func(t *testing.T) {
		s, st := openStore(t, t.TempDir())
		var asked []string
		s.Fault = func(op string) error { asked = append(asked, op); return nil }
		st.Sessions["a"] = &SessionRecord{Spec: capability.SessionSpec{ID: "a", Image: "py"}, Phase: SessionActive}
		if err := s.Write([]string{SessionKey("a")}, false); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(asked, []string{FaultJournalWrite}) {
			t.Fatalf("an unsynced write asked %v", asked)
		}
	})
}

// TestStoreVersion: a snapshot of another version, or one that is not
// JSON, refuses to load.
func TestStoreVersion(t *testing.T) {
	for name, snap := range map[string]string{
		"version 2": `{"version":2,"sessions":{},"grants":{},"approvals":{}}`,
		"not json":  `{"version":1,`,
	} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "state.json"), []byte(snap), 0o600)
		_, err := Open(dir)
		if !errors.Is(err, ErrState) {
			t.Fatalf("%s: %v, want ErrState", name, err)
		}
		if name == "version 2" && !strings.Contains(err.Error(), "version 2, want 1") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// A snapshot without the maps it later gained loads with them empty.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"version":1}`), 0o600)
	_, st := openStore(t, dir)
	if st.Sessions == nil || st.Grants == nil || st.Approvals == nil || st.Cards == nil || st.Patterns == nil {
		t.Fatalf("nil maps after load: %+v", st)
	}
}
