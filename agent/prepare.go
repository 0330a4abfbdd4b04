package agent

import (
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// PrepareLaunch makes a launch into an active session ready for the
// session runtime's shim to start (backend.Preparer): the same door as
// Launch, with the same record written first (process.run: durable before
// the prepared launch is returned, so before anything runs); if the record
// cannot be written the preparation is undone and nothing is returned. A backend that cannot prepare
// launches refuses (ErrLaunch wrapping backend.ErrNotSupported).
//
// beside (nil: none) runs on the prepared launch while the record is made
// durable, for the caller's own bookkeeping (the session runtime writes
// the process's directory and meta.json there): it must start nothing.
// If it fails, the preparation is undone and its error returned as it is;
// if the record or the backend fails after beside ran, the caller undoes
// what beside did.
func (a *Agent) PrepareLaunch(session string, spec backend.LaunchSpec, opts backend.LaunchOptions, actor string, beside func(*backend.PreparedLaunch) error) (*backend.PreparedLaunch, error) {
	if _, ok := a.Session(session); !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return nil, fmt.Errorf("%w: no argv", ErrInvalidRequest)
	}
	p, ok := a.kernel.(backend.Preparer)
	if !ok {
		return nil, fmt.Errorf("%w: %w: this backend starts no process outside the agent", ErrLaunch, backend.ErrNotSupported)
	}
	// The backend prepares (the run's cgroup, descriptors: nothing runs
	// in the session yet) while the record is made durable; the prepared
	// launch is handed out only once the record is written, and undone
	// if it cannot be.
	type prepared struct {
		pl        *backend.PreparedLaunch
		err, berr error
	}
	ready := make(chan prepared, 1)
	go func() {
		pl, err := p.PrepareLaunch(session, spec, opts)
		var berr error
		if err == nil && beside != nil {
			if berr = beside(pl); berr != nil {
				pl.Close(true)
				pl = nil
			}
		}
		ready <- prepared{pl, err, berr}
	}()
	eerr := a.emit(Event{Kind: EventRun, Session: session, Actor: actor, Tool: spec.Argv[0], Args: slices.Clone(spec.Argv), Outcome: "started"})
	r := <-ready
	if eerr != nil {
		if r.pl != nil {
			r.pl.Close(true)
		}
		return nil, eerr
	}
	if r.berr != nil {
		return nil, r.berr
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLaunch, r.err)
	}
	return r.pl, nil
}
