package dataplane

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
