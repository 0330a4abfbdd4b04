package dataplane

import "fmt"

// SessionUID is the uid (and gid) a session's processes run as when a launch
// names none: the session's own, from the session boundary, or nobody
// without one. The operator API shows it with each session (agent/api finds
// it as an optional method; a backend without it shows none).
func (d *Dataplane) SessionUID(name string) (uint32, error) {
	s, err := d.Session(name)
	if err != nil {
		return 0, err
	}
	if d.bnd == nil {
		return Nobody, nil
	}
	return d.bnd.UID(s.Index)
}

// HolderRunning says whether session name's holder (the process that holds
// its namespaces) runs: false from create until the session's first
// operation that needs its namespaces (a launch, a file get or put, a
// process grant). Without a boundary there is none (ErrNotSupported).
func (d *Dataplane) HolderRunning(name string) (bool, error) {
	if _, err := d.Session(name); err != nil {
		return false, err
	}
	if d.bnd == nil {
		return false, fmt.Errorf("%w: no session boundary", ErrNotSupported)
	}
	return d.bnd.HolderRunning(name)
}
