package dataplane

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// PrepareLaunch makes a launch in session ready for a shim to start (see
// boundary.Prepare and backend.Preparer). Without a session boundary it
// refuses: those sessions share one uid, and their processes are started by
// Launch alone.
func (d *Dataplane) PrepareLaunch(session string, p backend.LaunchSpec, opts backend.LaunchOptions) (*backend.PreparedLaunch, error) {
	s, err := d.Session(session)
	if err != nil {
		return nil, err
	}
	if d.bnd == nil {
		return nil, fmt.Errorf("%w: processes as objects need the session boundary (boundary off in this dataplane's config)", backend.ErrNotSupported)
	}
	return d.bnd.Prepare(s.Name, p, opts)
}

// StartPrepared is the Linux backend's backend.StartFunc.
var StartPrepared backend.StartFunc = boundary.StartPrepared

var _ backend.Preparer = (*Dataplane)(nil)
