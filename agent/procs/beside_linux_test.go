package procs

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
)

var errRecordLost = errors.New("audit log full")

// recordFailsDoor prepares and runs the caller's beside, then fails as the
// agent's door does when the process.run record cannot be written.
type recordFailsDoor struct{ backendDoor }

func (d recordFailsDoor) PrepareLaunch(session string, spec backend.LaunchSpec, opts backend.LaunchOptions, actor string, beside func(*backend.PreparedLaunch) error) (*backend.PreparedLaunch, error) {
	pl, err := d.backendDoor.PrepareLaunch(session, spec, opts, actor, beside)
	if err != nil {
		return nil, err
	}
	pl.Close(true)
	return nil, errRecordLost
}

// TestStartRecordFailsAfterLayout (issue 20): the process's directory and
// meta.json are written beside the door's record; when the record then
// fails, the start fails with its error and leaves no process directory,
// whether it took a spare's (renamed) or made its own, and nothing runs.
func TestStartRecordFailsAfterLayout(t *testing.T) {
	r := newRig(t, 0)
	for i := 0; i < 200; i++ {
		r.m.mu.Lock()
		n := len(r.m.spares)
		r.m.mu.Unlock()
		if n == spareCount {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	door := r.m.cfg.Door
	r.m.cfg.Door = recordFailsDoor{door.(backendDoor)}
	// The spares first (no refill follows a failed door), then a
	// directory of its own.
	for i := 0; i <= spareCount; i++ {
		p, err := r.m.Start(r.session, wire.ProcessStart{Argv: []string{"/bin/echo", "x"}}, "test")
		if !errors.Is(err, errRecordLost) || p != nil {
			t.Fatalf("start %d with the record failing: %v, %v; want %v", i, p, err, errRecordLost)
		}
		ents, _ := os.ReadDir(r.cfg.Dir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), spareDirPrefix) {
				t.Errorf("start %d: its directory %s is left", i, e.Name())
			}
		}
	}
	if n := len(r.m.List(r.session)); n != 0 {
		t.Errorf("%d processes listed after failed starts", n)
	}
	r.m.cfg.Door = door
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/echo", "after"}})
	if out, _ := readAll(t, p, 0, 0, 10*time.Second); out != "after\n" {
		t.Errorf("a start after them: %q", out)
	}
}
