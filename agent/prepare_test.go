package agent

import (
	"errors"
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

	pl, err := a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op", nil)
	if err != nil || pl == nil || pl.Args[0] != "prepared" {
		t.Fatalf("PrepareLaunch = %v, %v", pl, err)
	}
	if !sink.has(EventRun) {
		t.Fatalf("prepared launch handed out without its %s record: %v", EventRun, sink.kinds())
	}
	pl.Close(false)

	sink.failRun = true
	pl, err = a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op", nil)
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
	if _, err := a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op", nil); !errors.Is(err, ErrLaunch) {
		t.Fatalf("with the backend failing: err = %v, want ErrLaunch", err)
	}
	if kinds := sink.kinds(); len(kinds) != before+1 || kinds[len(kinds)-1] != EventRun {
		t.Fatalf("with the backend failing: events %v after %d, want one %s record", kinds, before, EventRun)
	}
}

// besideSink holds the process.run record until the caller's beside has
// run (5 s at most) and says whether it had; with fail, the record then
// fails.
type besideSink struct {
	eventLog
	ran        chan struct{}
	overlapped bool
	fail       bool
}

func (s *besideSink) Emit(e Event) error {
	if e.Kind == EventRun {
		select {
		case <-s.ran:
			s.overlapped = true
		case <-time.After(5 * time.Second):
		}
		if s.fail {
			return errRecord
		}
	}
	return s.eventLog.Emit(e)
}

// TestPrepareLaunchBeside: the caller's beside runs on the prepared launch
// while the process.run record is made durable (the record's write waits
// for it here), and the launch is handed out only after both; a beside
// that fails undoes the preparation and its error comes back as it is; a
// record that fails after beside ran undoes it too.
func TestPrepareLaunchBeside(t *testing.T) {
	k := &preparerKernel{Backend: memKernel(t)}
	sink := &besideSink{ran: make(chan struct{})}
	a := openAgent(t, k, t.TempDir(), func(c *Config) { c.Events = sink })
	mustSession(t, a, SessionSpec{ID: "s1"})
	spec := backend.LaunchSpec{Argv: []string{"/bin/echo", "x"}}
	var seen *backend.PreparedLaunch
	pl, err := a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op", func(pl *backend.PreparedLaunch) error {
		if sink.has(EventRun) {
			t.Error("beside ran after the record was written")
		}
		seen = pl
		close(sink.ran)
		return nil
	})
	if err != nil || pl == nil || pl != seen {
		t.Fatalf("PrepareLaunch = %v, %v (beside saw %v)", pl, err, seen)
	}
	if !sink.overlapped || !sink.has(EventRun) {
		t.Fatalf("the record waited for beside: %v; record written: %v", sink.overlapped, sink.has(EventRun))
	}
	pl.Close(false)

	errBeside := errors.New("meta.json: disk full")
	sink.ran = make(chan struct{})
	pl, err = a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op", func(*backend.PreparedLaunch) error {
		close(sink.ran)
		return errBeside
	})
	if err != errBeside || pl != nil {
		t.Fatalf("with beside failing: PrepareLaunch = %v, %v; want nil, %v", pl, err, errBeside)
	}

	sink.ran, sink.fail = make(chan struct{}), true
	ran := false
	pl, err = a.PrepareLaunch("s1", spec, backend.LaunchOptions{}, "op", func(*backend.PreparedLaunch) error {
		ran = true
		close(sink.ran)
		return nil
	})
	if !errors.Is(err, errRecord) || pl != nil || !ran {
		t.Fatalf("with the record failing: PrepareLaunch = %v, %v (beside ran %v); want nil, %v", pl, err, ran, errRecord)
	}
	k.mu.Lock()
	prepared, abandoned, released := k.prepared, k.abandoned, k.released
	k.mu.Unlock()
	if prepared != 3 || abandoned != 2 || released != 1 {
		t.Fatalf("prepared %d, abandoned %d, released %d; want 3, 2 (beside failed, the record failed), 1", prepared, abandoned, released)
	}
}
