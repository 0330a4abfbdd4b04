package agent

import (
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// PrepareLaunch makes a launch into an active session ready for the
// session runtime's shim to start (backend.Preparer): the same door as
// Launch, with the same record written first (process.run); if the record
// cannot be written nothing is prepared. A backend that cannot prepare
// launches refuses (ErrLaunch wrapping backend.ErrNotSupported).
func (a *Agent) PrepareLaunch(session string, spec backend.LaunchSpec, opts backend.LaunchOptions, actor string) (*backend.PreparedLaunch, error) {
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
	if err := a.emit(Event{Kind: EventRun, Session: session, Actor: actor, Tool: spec.Argv[0], Args: slices.Clone(spec.Argv), Outcome: "started"}); err != nil {
		return nil, err
	}
	pl, err := p.PrepareLaunch(session, spec, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLaunch, err)
	}
	return pl, nil
}
