package agent

// Credential locations (the backend's file never-list: /root, the homes'
// .ssh, .aws and .config/gcloud, the shadow files, ...) are denied under
// any file grant. A grant reaches one only where an entry of it names the
// location or a path in it and an admin policy of the policy directory
// permits that use at that path: the entry then carries Override, and the
// backend opens the location to it (backend.FileRightsView). A broad grant
// above a location never does, and the agent's own state and policy
// directories and socket are never opened (the backend's fixed list).
// Overrides are derived as never-list exceptions are: at grant time, and
// again for every live grant at each policy apply and reload, and at Open
// (forbids.go).

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
)

// fileOverrideOK says whether an admin policy in force permits session
// the use entry e gives at its path; a.mu held.
func (a *Agent) fileOverrideOK(session string, e backend.FileEntry) bool {
	u := UseRequest{Class: ClassFSScope, Path: e.Path}
	switch e.Access {
	case backend.FileRead, backend.FileWrite, backend.FileDelete:
		u.Op = string(e.Access)
	case backend.FilePersist, backend.FilePersistSession:
		u.Class, u.Op = ClassPersistence, "persist"
	default:
		return false // a deny needs none; a socket under one is Block tier
	}
	_, ok := a.engine.AdminPermit(session, u, a.cfg.Now())
	return ok
}

// fileOverrides marks Override the entries an admin policy permits.
func (a *Agent) fileOverrides(session string, es []backend.FileEntry) {
	for i, e := range es {
		es[i].Override = a.fileOverrideOK(session, e)
	}
}

// rederiveFileOverrides makes rec's file entries' overrides what the
// policies in force say, in the backend (backend.FileOverrides) and in
// rec; it reports whether rec changed. The backend is told even where rec
// already says so: it then drops a copy with the other value (a crash
// between its change and rec's, then reconcile re-applying rec, leaves
// both). a.mu held.
func (a *Agent) rederiveFileOverrides(rec *GrantRecord) (bool, error) {
	changed := false
	var err error
	fo, canSet := a.kernel.(backend.FileOverrides)
	for i, e := range rec.Delta.Files {
		switch e.Access {
		case backend.FileDeny, backend.FileConnect:
			continue
		}
		want := a.fileOverrideOK(rec.Session, e)
		if !canSet {
			if want != e.Override {
				return changed, fmt.Errorf("%w: grant %s: %s: the backend cannot change a file entry's admin override", ErrKernel, rec.ID, e)
			}
			continue
		}
		e.Override = want
		if kerr := fo.SetFileOverride(rec.Session, e); kerr != nil {
			err = fmt.Errorf("%w: grant %s: file override %s: %w", ErrKernel, rec.ID, e, kerr)
			continue
		}
		if rec.Delta.Files[i] != e {
			rec.Delta.Files[i] = e
			changed = true
		}
	}
	return changed, err
}
