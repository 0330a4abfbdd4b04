package agent

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// preparerKernel is the memory backend with the Preparer role: it counts
// the launches it prepares and how each was closed (the control plane's
// order and undo are tested here; the real preparation is the boundary's,
// tested as root in agent/procs).
type preparerKernel struct {
	*memory.Backend
	fail error // returned by PrepareLaunch when set

	mu        sync.Mutex
	prepared  int
	abandoned int
	released  int
}

func (k *preparerKernel) PrepareLaunch(string, backend.LaunchSpec, backend.LaunchOptions) (*backend.PreparedLaunch, error) {
	if k.fail != nil {
		return nil, k.fail
	}
	k.mu.Lock()
	k.prepared++
	k.mu.Unlock()
	return &backend.PreparedLaunch{Args: []string{"prepared"}, Close: func(abandon bool) {
		k.mu.Lock()
		defer k.mu.Unlock()
		if abandon {
			k.abandoned++
		} else {
			k.released++
		}
	}}, nil
}

// runFailSink fails the process.run record and keeps every other event.
type runFailSink struct {
	eventLog
	failRun bool
}

var errRecord = errors.New("audit log full")

func (s *runFailSink) Emit(e Event) error {
	if s.failRun && e.Kind == EventRun {
		return errRecord
	}
	return s.eventLog.Emit(e)
}

// TestPrepareLaunchRecordFirst: the backend prepares while the process.run
// record is written, but a prepared launch is handed out only with its
// record written; when the record fails the preparation is undone
// (abandoned: its cgroup removed) and the record's error returned; when
// the backend fails the record stands (as a launch's does) and the error
// is ErrLaunch.
func TestPrepareLaunchRecordFirst(t *testing.T) {
	k := &preparerKernel{Backend: memKernel(t)}
	sink := &runFailSink{}
	a := openAgent(t, k, t.TempDir(), func(c *Config) { c.Events = sink })
	mustSession(t, a, SessionSpec{ID: "s1"})
	spec := backend.LaunchSpec{Argv: []string{"/bin/echo", "x"}}

	pl, err := a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op")
	if err != nil || pl == nil || pl.Args[0] != "prepared" {
		t.Fatalf("PrepareLaunch = %v, %v", pl, err)
	}
	if !sink.has(EventRun) {
		t.Fatalf("prepared launch handed out without its %s record: %v", EventRun, sink.kinds())
	}
	pl.Close(false)

	sink.failRun = true
	pl, err = a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op")
	if !errors.Is(err, errRecord) || pl != nil {
		t.Fatalf("with the record failing: PrepareLaunch = %v, %v; want nil, %v", pl, err, errRecord)
	}
	k.mu.Lock()
	prepared, abandoned, released := k.prepared, k.abandoned, k.released
	k.mu.Unlock()
	if prepared != 2 || abandoned != 1 || released != 1 {
		t.Fatalf("prepared %d, abandoned %d, released %d; want 2, 1 (the one whose record failed), 1", prepared, abandoned, released)
	}

	sink.failRun = false
	k.fail = errors.New("no cgroup")
	before := len(sink.kinds())
	if _, err := a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op"); !errors.Is(err, ErrLaunch) {
		t.Fatalf("with the backend failing: err = %v, want ErrLaunch", err)
	}
	if kinds := sink.kinds(); len(kinds) != before+1 || kinds[len(kinds)-1] != EventRun {
		t.Fatalf("with the backend failing: events %v after %d, want one %s record", kinds, before, EventRun)
	}
}

// commitSink is a Committer: deferred events count as durable once a
// Commit has reached its then; while hold is set, each Commit then waits
// for release before it returns (the audit log's checkpoint, still being
// written and synced); with fail set, a Commit makes nothing durable.
type commitSink struct {
	eventLog
	mu       sync.Mutex
	deferred []bool
	durable  int // events made durable (a prefix of ev)
	hold     bool
	fail     bool
	release  chan struct{}
}

func (s *commitSink) Emit(e Event) error {
	s.mu.Lock()
	s.deferred = append(s.deferred, e.Defer)
	if !e.Defer {
		s.durable = len(s.deferred)
	}
	s.mu.Unlock()
	return s.eventLog.Emit(e)
}

func (s *commitSink) Commit(then func() error) error {
	s.mu.Lock()
	if s.fail {
		s.mu.Unlock()
		return errRecord
	}
	s.durable = len(s.deferred)
	hold, release := s.hold, s.release
	s.mu.Unlock()
	var err error
	if then != nil {
		err = then()
	}
	if hold {
		<-release
	}
	return err
}

// TestPrepareLaunchWaitsForTheRecordNotTheCheckpoint: the process.run
// record is written deferred and made durable by a commit; the prepared
// launch is handed out once the record is durable, while the sink's own
// end of the commit (the checkpoint) is still going on; a commit that
// cannot make the record durable hands nothing out and undoes the
// preparation.
func TestPrepareLaunchWaitsForTheRecordNotTheCheckpoint(t *testing.T) {
	k := &preparerKernel{Backend: memKernel(t)}
	sink := &commitSink{release: make(chan struct{})}
	a := openAgent(t, k, t.TempDir(), func(c *Config) { c.Events = sink })
	mustSession(t, a, SessionSpec{ID: "s1"})
	spec := backend.LaunchSpec{Argv: []string{"/bin/echo", "x"}}

	sink.mu.Lock()
	sink.hold = true
	sink.mu.Unlock()
	type result struct {
		pl  *backend.PreparedLaunch
		err error
	}
	got := make(chan result, 1)
	go func() {
		pl, err := a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op")
		got <- result{pl, err}
	}()
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		close(sink.release)
		t.Fatal("PrepareLaunch waited for the whole commit (the checkpoint), not for the record to be durable")
	}
	if r.err != nil || r.pl == nil {
		t.Fatalf("PrepareLaunch = %v, %v", r.pl, r.err)
	}
	kinds := sink.kinds()
	sink.mu.Lock()
	run := slices.Index(kinds, EventRun)
	deferred, durable := run >= 0 && sink.deferred[run], sink.durable
	sink.hold = false
	sink.mu.Unlock()
	close(sink.release)
	if run < 0 || !deferred || durable <= run {
		t.Fatalf("launch handed out with its %s record at %d (deferred %v), durable up to %d: %v", EventRun, run, deferred, durable, kinds)
	}
	r.pl.Close(false)

	sink.mu.Lock()
	sink.fail = true
	sink.mu.Unlock()
	pl, err := a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op")
	if !errors.Is(err, errRecord) || pl != nil {
		t.Fatalf("with the commit failing: PrepareLaunch = %v, %v; want nil, %v", pl, err, errRecord)
	}
	k.mu.Lock()
	prepared, abandoned := k.prepared, k.abandoned
	k.mu.Unlock()
	if prepared != 2 || abandoned != 1 {
		t.Fatalf("prepared %d, abandoned %d; want 2, 1 (the one whose record was not made durable)", prepared, abandoned)
	}
}
