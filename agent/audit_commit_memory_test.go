package agent

// The grant's records and its commit, on the memory backend with a real
// audit log (agent/audit) as the event sink: a grant writes its request and
// issue records, makes them durable with one commit (one fdatasync, one
// checkpoint), and writes its live record to the journal only once they are
// durable; a failed commit rolls the grant back; a refused request's record
// is durable before the answer.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// auditSink writes the agent's events to an audit log as the daemon does:
// deferred ones with Write, the others with Append; Commit is the log's.
type auditSink struct {
	log *audit.Log

	mu         sync.Mutex
	appends    int
	writes     int
	commits    int      // commits that had records to make durable
	inThen     func()   // called inside Commit's then, before the agent's work
	failCommit error    // Commit fails so (as a failed fdatasync: then not called)
	failAfter  error    // CommitBeside's sync fails so, after then ran
	kinds      []string // every event, in order
	durable    uint64   // the last seq an Append or Commit made durable
	marks      []uint64 // the seqs CommitBeside gave then
	lookups    int      // HasRecord calls
}

func newAuditSink(t testing.TB, dir string) *auditSink {
	t.Helper()
	l, err := audit.Open(audit.Config{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &auditSink{log: l}
}

// CommitBeside is the log's, counted as Commit counts; with failAfter set
// then runs and the sync fails (as a failed fdatasync beside the
// journal's write).
func (s *auditSink) CommitBeside(then func(seq uint64, hash string) error) error {
	s.mu.Lock()
	fail, failAfter, hook := s.failCommit, s.failAfter, s.inThen
	s.mu.Unlock()
	if fail != nil {
		return fail
	}
	head, headHash := s.log.Head()
	s.mu.Lock()
	if head > s.durable {
		s.commits++
	}
	s.mu.Unlock()
	wrapped := func(seq uint64, hash string) error {
		s.mu.Lock()
		s.marks = append(s.marks, seq)
		s.mu.Unlock()
		if then == nil {
			return nil
		}
		if hook != nil {
			hook()
		}
		return then(seq, hash)
	}
	if failAfter != nil {
		return errors.Join(failAfter, wrapped(head, headHash))
	}
	err := s.log.CommitBeside(wrapped)
	if err == nil {
		s.mu.Lock()
		s.durable = max(s.durable, head)
		s.mu.Unlock()
	}
	return err
}

// HasRecord is the log's RecordHash compared with hash, as the daemon's.
func (s *auditSink) HasRecord(seq uint64, hash string) (bool, bool, error) {
	s.mu.Lock()
	s.lookups++
	s.mu.Unlock()
	h, ok, err := s.log.RecordHash(seq)
	return ok && h == hash, true, err
}

// afterSink is an auditSink that is only a Committer (no CommitBeside):
// the agent writes the live record once the records are durable.
type afterSink struct{ s *auditSink }

func (p afterSink) Emit(e Event) error             { return p.s.Emit(e) }
func (p afterSink) Commit(then func() error) error { return p.s.Commit(then) }

func (s *auditSink) Emit(e Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kinds = append(s.kinds, e.Kind)
	if e.Kind == EventRequestDecided || e.Kind == EventRevokeDone {
		return nil // metrics only: the daemon writes no record of them
	}
	ev := audit.Event{Type: audit.EventDecision, Session: e.Session, Handle: e.Grant, Reason: e.Kind}
	if e.Defer {
		s.writes++
		_, err := s.log.Write(ev)
		return err
	}
	s.appends++
	r, err := s.log.Append(ev)
	if err == nil {
		s.durable = r.Seq
	}
	return err
}

func (s *auditSink) Commit(then func() error) error {
	s.mu.Lock()
	fail, hook := s.failCommit, s.inThen
	s.mu.Unlock()
	if fail != nil {
		return fail
	}
	head, _ := s.log.Head()
	s.mu.Lock()
	if head > s.durable {
		s.commits++
	}
	s.mu.Unlock()
	err := s.log.Commit(func() error {
		if then == nil {
			return nil
		}
		if hook != nil {
			hook()
		}
		return then()
	})
	if err == nil {
		s.mu.Lock()
		s.durable = max(s.durable, head)
		s.mu.Unlock()
	}
	return err
}

func (s *auditSink) counts() (appends, writes, commits int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.appends, s.writes, s.commits
}

// verified checks the log verifies and, once its checkpoint writer has
// caught up, the checkpoint vouches for its head (no note: nothing
// acknowledged is outside the checkpoint then).
func (s *auditSink) verified(t testing.TB) *audit.Report {
	t.Helper()
	if err := s.log.Checkpointed(); err != nil {
		t.Fatalf("audit checkpoint: %v", err)
	}
	rep, err := audit.Verify(s.log.Path(), s.log.PublicKey())
	if err != nil {
		t.Fatalf("audit verify: %v", err)
	}
	if head, _ := s.log.Head(); rep.Head != head || len(rep.Notes) != 0 {
		t.Fatalf("audit log: verified head %d of %d, notes %v: the checkpoint does not vouch for every record", rep.Head, head, rep.Notes)
	}
	return rep
}

// liveInJournal counts the journal's live grant records.
func liveInJournal(t testing.TB, dir string) int {
	return journalRecords(t, dir, `{"k":"g"`, "live")
}

// journalRecords counts the journal's records that begin with prefix and
// are in phase.
func journalRecords(t testing.TB, dir, prefix, phase string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "state.journal"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	n := 0
	for _, ln := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(ln, []byte(prefix)) && bytes.Contains(ln, []byte(`"phase":"`+phase+`"`)) {
			n++
		}
	}
	return n
}

// TestGrantCommitsAuditBeforeLive: one grant through Request writes its two
// records unsynced and makes them durable with one commit; its live record
// is written inside the commit, beside the log's fdatasync, carrying the
// seq of the batch's last record (BesideCommitter), or once the records
// are durable (a plain Committer, mark 0); after the answer the checkpoint
// vouches for both records.
func TestGrantCommitsAuditBeforeLive(t *testing.T) {
	for _, beside := range []bool{true, false} {
		t.Run(map[bool]string{true: "beside", false: "after"}[beside], func(t *testing.T) {
			sink := newAuditSink(t, t.TempDir())
			var ev EventSink = sink
			if !beside {
				ev = afterSink{sink}
			}
			m := newMemoryAgent(t, func(c *Config) { c.Events = ev })
			m.session(t, "s1")
			a0, w0, c0 := sink.counts()
			thenRan := 0
			var issueSeq uint64
			sink.inThen = func() {
				thenRan++
				lines := bytes.Split(bytes.TrimSpace(mustRead(t, sink.log.Path())), []byte("\n"))
				last := string(lines[len(lines)-1])
				if !strings.Contains(last, `"grant.issue"`) || !strings.Contains(string(lines[len(lines)-2]), `"request"`) {
					t.Errorf("inside the commit: the log ends %s / %s, want the request and grant.issue records", lines[len(lines)-2], last)
				}
				issueSeq, _ = sink.log.Head()
				if n := liveInJournal(t, m.dir); n != 0 {
					t.Errorf("inside the commit, before the agent's work: %d live grant records in the journal, want none yet", n)
				}
			}
			res, err := m.Request(ctx, []GrantRequest{{Session: "s1", Lifecycle: LifecycleSession, Capability: loopEgress("127.0.0.2:8080")}})
			if err != nil || len(res) != 1 || res[0].Outcome != "granted" {
				t.Fatalf("request: %v %+v", err, res)
			}
			if thenRan != 1 {
				t.Fatalf("the journal's write ran inside %d commits, want 1", thenRan)
			}
			if n := liveInJournal(t, m.dir); n != 1 {
				t.Fatalf("%d live grant records in the journal after the answer, want 1", n)
			}
			wantMark := uint64(0)
			if beside {
				wantMark = issueSeq
			}
			if got := m.st.Grants[res[0].Grant.ID].AuditMark; got != wantMark {
				t.Fatalf("the live record's audit mark %d, want %d (the grant.issue record's seq, 0 after a plain commit)", got, wantMark)
			}
			if beside && !bytes.Contains(mustRead(t, filepath.Join(m.dir, "state.journal")), fmt.Appendf(nil, `"audit_mark":%d`, issueSeq)) {
				t.Fatalf("the journal's live record does not carry audit_mark %d", issueSeq)
			}
			a1, w1, c1 := sink.counts()
			if a1 != a0 || w1-w0 != 2 || c1-c0 != 1 {
				t.Fatalf("one grant: %d appends, %d deferred writes, %d commits; want 0, 2 (request, grant.issue), 1", a1-a0, w1-w0, c1-c0)
			}
			sink.verified(t)
			m.wantAllowed(t, "s1", "127.0.0.2:8080")
			m.reopen(t) // the mark is within the log: still live
			m.wantAllowed(t, "s1", "127.0.0.2:8080")
		})
	}
}

// TestNotifyGrantOneCommit: a Notify-tier grant's notice joins the same
// commit.
func TestNotifyGrantOneCommit(t *testing.T) {
	sink := newAuditSink(t, t.TempDir())
	m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
	m.session(t, "s1")
	a0, w0, c0 := sink.counts()
	res, err := m.Request(ctx, []GrantRequest{{Session: "s1", Lifecycle: LifecycleSession, Capability: loopEgress("198.51.100.7:443")}})
	if err != nil || len(res) != 1 || res[0].Outcome != "granted" || res[0].Grant.Tier != TierNotify {
		t.Fatalf("request: %v %+v", err, res)
	}
	a1, w1, c1 := sink.counts()
	if a1 != a0 || w1-w0 != 3 || c1-c0 != 1 {
		t.Fatalf("one notify grant: %d appends, %d deferred writes, %d commits; want 0, 3, 1", a1-a0, w1-w0, c1-c0)
	}
	sink.verified(t)
}

// TestRefusedRequestCommitted: a request refused at the gate has no grant to
// commit its record: Request commits it before the answer.
func TestRefusedRequestCommitted(t *testing.T) {
	sink := newAuditSink(t, t.TempDir())
	m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
	m.session(t, "s1")
	_, w0, c0 := sink.counts()
	res, err := m.Request(ctx, []GrantRequest{{Session: "s1", Lifecycle: LifecycleSession, Capability: memPrefixCap("203.0.113.0/24")}})
	if err != nil || len(res) != 1 || res[0].Outcome != "denied" {
		t.Fatalf("request outside the manifest: %v %+v", err, res)
	}
	_, w1, c1 := sink.counts()
	if w1-w0 != 1 || c1-c0 != 1 {
		t.Fatalf("a refused request: %d deferred writes, %d commits; want 1, 1", w1-w0, c1-c0)
	}
	sink.verified(t)
}

// TestGrantCommitFails: when the audit log cannot make the grant's records
// durable the grant is refused and rolled back (nothing live in the backend
// or the journal, after a restart too), and the same request succeeds once
// the log works.
func TestGrantCommitFails(t *testing.T) {
	sink := newAuditSink(t, t.TempDir())
	m := newMemoryAgent(t, func(c *Config) { c.Events = sink })
	m.session(t, "s1")
	boom := errors.New("audit: sync: input/output error")
	sink.failCommit = boom
	res, err := m.Request(ctx, []GrantRequest{{Session: "s1", Lifecycle: LifecycleSession, Capability: loopEgress("127.0.0.2:8080")}})
	if res == nil || res[0].Outcome != "denied" || !errors.Is(res[0].Err, boom) {
		t.Fatalf("request with a failing commit: %v %+v, want denied with the commit's error", err, res)
	}
	if !errors.Is(err, boom) {
		t.Fatalf("Request's error %v: want the requests' records reported unrecorded", err)
	}
	if n := len(m.liveHandles(t)); n != 0 {
		t.Fatalf("%d live handles after a failed commit", n)
	}
	m.wantDenied(t, "s1", "127.0.0.2:8080")
	if n := liveInJournal(t, m.dir); n != 0 {
		t.Fatalf("%d live grant records in the journal after a failed commit", n)
	}
	m.reopen(t)
	m.wantDenied(t, "s1", "127.0.0.2:8080")
	sink.failCommit = nil
	m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress("127.0.0.2:8080")})
	m.wantAllowed(t, "s1", "127.0.0.2:8080")
	sink.verified(t)
}

// TestStoreFaultsMemoryAudit is the store's fault injection with the audit
// log as the sink: the journal's writes of a grant now run inside the
// audit's commit.
func TestStoreFaultsMemoryAudit(t *testing.T) {
	testStoreFaultsWith(t, func(t *testing.T) Kernel {
		b, err := memory.New(memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, func(t *testing.T) EventSink { return newAuditSink(t, t.TempDir()) })
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
