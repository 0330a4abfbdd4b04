package dataplane

import (
	"fmt"
	"io"
	"os"

	"github.com/shinken-agent/shinken/agent/backend"
)

var _ backend.SessionFiles = (*Dataplane)(nil)

// OpenFile opens root/rel in session's view as the session (see
// boundary.OpenFile); it needs the session boundary.
func (d *Dataplane) OpenFile(session, root, rel string) (*os.File, error) {
	s, err := d.Session(session)
	if err != nil {
		return nil, err
	}
	if d.bnd == nil {
		return nil, fmt.Errorf("%w: files in and out need the session boundary (boundary off in this dataplane's config)", backend.ErrNotSupported)
	}
	return d.bnd.OpenFile(s.Name, root, rel)
}

// WriteFile writes root/rel in session's view as the session (see
// boundary.WriteFile); it needs the session boundary.
func (d *Dataplane) WriteFile(session, root, rel string, r io.Reader, max int64, commit func(int64) error) (int64, error) {
	s, err := d.Session(session)
	if err != nil {
		return 0, err
	}
	if d.bnd == nil {
		return 0, fmt.Errorf("%w: files in and out need the session boundary (boundary off in this dataplane's config)", backend.ErrNotSupported)
	}
	return d.bnd.WriteFile(s.Name, root, rel, r, max, commit)
}
