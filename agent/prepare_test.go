package agent

import (
	"errors"
	"sync"
	"testing"

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
