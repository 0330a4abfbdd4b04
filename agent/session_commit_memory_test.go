package agent

// A session's create on the memory backend with a real audit log as the
// event sink: its audit record is written unsynced and made durable by one
// commit, and the active record reaches the journal only inside that
// commit, once the record is durable; a failed commit or journal write
// leaves no session (in memory, the backend or the journal) and, when the
// create's record was already durable, a session.end record after it.

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/store"
)

// activeInJournal counts the journal's active records of session id.
func activeInJournal(t testing.TB, dir, id string) int {
	return journalRecords(t, dir, `{"k":"s","id":"`+id+`"`, "active")
}

// TestSessionCreateAuditedBeforeActive: every journal write of the new
// session's active record happens while the audit log already holds its
// session.create record durably (so a crash never leaves an active session
// the log does not show), and one create costs one deferred write and one
// commit, no synchronous append.
func TestSessionCreateAuditedBeforeActive(t *testing.T) {
	sink := newAuditSink(t, t.TempDir())
	m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
	m.session(t, "s1")
	a0, w0, c0 := sink.counts()
	checked, thenRan := 0, 0
	m.store.Fault = func(op string) error {
		if op != store.FaultJournalWrite {
			return nil
		}
		checked++
		// The log's Commit calls then (inThen, then the agent's write)
		// only once its fdatasync made the records durable.
		if thenRan != 1 {
			t.Errorf("the journal's write of s2 outside the audit commit's then (%d thens ran)", thenRan)
		}
		lines := bytes.Split(bytes.TrimSpace(mustRead(t, sink.log.Path())), []byte("\n"))
		if last := string(lines[len(lines)-1]); !strings.Contains(last, `"session.create"`) || !strings.Contains(last, `"s2"`) {
			t.Errorf("at the journal's write of s2: the audit log ends %s, want s2's session.create record", last)
		}
		return nil
	}
	sink.inThen = func() {
		thenRan++
		if n := activeInJournal(t, m.dir, "s2"); n != 0 {
			t.Errorf("inside the commit, before the agent's work: %d active records of s2 in the journal, want none yet", n)
		}
	}
	if err := m.CreateSession(SessionSpec{ID: "s2", Image: "py"}); err != nil {
		t.Fatal(err)
	}
	m.store.Fault = nil
	if checked == 0 {
		t.Fatal("the create wrote nothing to the journal")
	}
	if thenRan != 1 {
		t.Fatalf("the journal's write of the active record ran inside %d commits, want 1", thenRan)
	}
	if n := activeInJournal(t, m.dir, "s2"); n != 1 {
		t.Fatalf("%d active records of s2 in the journal after the answer, want 1", n)
	}
	a1, w1, c1 := sink.counts()
	if a1 != a0 || w1-w0 != 1 || c1-c0 != 1 {
		t.Fatalf("one create: %d appends, %d deferred writes, %d commits; want 0, 1 (session.create), 1", a1-a0, w1-w0, c1-c0)
	}
	sink.verified(t)
	m.reopen(t)
	if _, ok := m.Session("s2"); !ok {
		t.Fatal("s2 is gone after a restart")
	}
}

// TestSessionCreateCommitFails: a create whose audit record cannot be made
// durable, or whose active record cannot be written once it is, is
// refused and leaves no session in memory, the backend or the journal
// (after a restart too); in the second case the log's session.create
// record is followed by s2's session.end. The same create succeeds once
// both work.
func TestSessionCreateCommitFails(t *testing.T) {
	boom := errors.New("audit: sync: input/output error")
	full := errors.New("no space left on device")
	for _, tc := range []struct {
		name    string
		arm     func(m *memoryAgent, sink *auditSink)
		want    error
		wantEnd bool
	}{
		{"commit", func(m *memoryAgent, sink *auditSink) { sink.failCommit = boom }, boom, false},
		{"journal", func(m *memoryAgent, sink *auditSink) {
			m.store.Fault = func(op string) error {
				if op == store.FaultJournalWrite {
					return full
				}
				return nil
			}
		}, full, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newAuditSink(t, t.TempDir())
			m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
			m.session(t, "s1")
			tc.arm(m, sink)
			err := m.CreateSession(SessionSpec{ID: "s2", Image: "py"})
			if !errors.Is(err, tc.want) {
				t.Fatalf("create: %v, want %v", err, tc.want)
			}
			sink.failCommit, m.store.Fault = nil, nil
			check := func(when string) {
				if _, ok := m.Session("s2"); ok {
					t.Fatalf("%s: s2 is a session", when)
				}
				ks, err := m.b.Sessions()
				if err != nil || len(ks) != 1 || ks[0].Name != "s1" {
					t.Fatalf("%s: backend sessions %+v (%v), want s1 only", when, ks, err)
				}
				if n := activeInJournal(t, m.dir, "s2"); n != 0 {
					t.Fatalf("%s: %d active records of s2 in the journal", when, n)
				}
			}
			check("after the failed create")
			ended := false
			for _, ln := range bytes.Split(mustRead(t, sink.log.Path()), []byte("\n")) {
				if bytes.Contains(ln, []byte(`"session.end"`)) && bytes.Contains(ln, []byte(`"s2"`)) {
					ended = true
				}
			}
			if ended != tc.wantEnd {
				t.Fatalf("s2's session.end in the audit log: %v, want %v", ended, tc.wantEnd)
			}
			m.reopen(t)
			check("after a restart")
			m.session(t, "s2")
			sink.verified(t)
		})
	}
}
