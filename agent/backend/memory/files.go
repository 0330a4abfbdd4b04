package memory

import (
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The files table (fs.scope): per session, the Delta's file entries, as
// the Linux backend holds them (its mount view is derived from the entries
// of live handles at every change). Open is the use-time check: what the
// next open through the session's view gives, evaluated on the entries
// whose handle chain is live (backend.FileRightsAt), with the credential
// locations of Config.FileNever denied first.

// FileOp is a use Open checks.
type FileOp = backend.FileAccess

// checkFiles refuses what Apply could not hold: an unknown session, an
// invalid or dead handle, an approve-once handle (the Linux mount view has
// no use-time hook to consume it), a delete entry without its grant's
// write over it (the mount view cannot give delete alone); b.mu held.
func (b *Backend) checkFiles(name string, es []backend.FileEntry) error {
	if len(es) == 0 {
		return nil
	}
	if _, ok := b.sessions[name]; !ok {
		return fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	// As the Linux mount view: delete only inside its grant's write.
	if err := backend.CheckDeleteCovered(es); err != nil {
		return err
	}
	for _, e := range es {
		h, err := b.readHandle(e.Handle)
		if err != nil {
			return err
		}
		if err := backend.CheckSocketEntry(e, b.cfg.FileNever); err != nil {
			return err
		}
		if h.state == backend.HandleOnce {
			return fmt.Errorf("%w: an approve-once handle for %s: a file view has no use to consume it at", backend.ErrNotSupported, e)
		}
	}
	return nil
}

// addFiles adds the entries s lacks and returns those it added; b.mu held.
func (s *session) addFiles(es []backend.FileEntry) []backend.FileEntry {
	var added []backend.FileEntry
	for _, e := range es {
		if !slices.Contains(s.files, e) {
			s.files = append(s.files, e)
			added = append(added, e)
		}
	}
	return added
}

// removeFiles drops es from s (those absent are no error); b.mu held.
func (s *session) removeFiles(es []backend.FileEntry) {
	s.files = slices.DeleteFunc(s.files, func(e backend.FileEntry) bool { return slices.Contains(es, e) })
}

// Open is the decision for the next open of path by a process of session
// name, for op (read, write, delete, connect): whether the session's view would let
// it. A path under a credential location (Config.FileNever) is refused
// whatever the entries say, unless entries with an admin override name it
// or a path in it and the location is not one of Config.FileNeverFixed
// (backend.FileRightsView).
func (b *Backend) Open(name, path string, op FileOp) (bool, error) {
	if err := (backend.FileEntry{Path: path, Access: op, Handle: backend.HandleRef{Slot: 1}}).Validate(); err != nil || op == backend.FileDeny {
		return false, fmt.Errorf("%w: open %s for %s", backend.ErrInvalidFileEntry, path, op)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[name]
	if !ok {
		return false, nil
	}
	live := slices.DeleteFunc(slices.Clone(s.files), func(e backend.FileEntry) bool { return b.handleCheck(e.Handle, useNew) != backend.ReasonNone })
	if op == backend.FileConnect {
		for _, n := range b.cfg.FileNever {
			if backend.PathUnder(path, n) {
				return false, nil
			}
		}
		// A socket grant names the socket itself, nothing below it.
		return backend.ConnectAt(live, path), nil
	}
	r := backend.FileRightsView(live, b.cfg.FileNever, b.cfg.FileNeverFixed, path)
	switch op {
	case backend.FileRead:
		return r.Read, nil
	case backend.FileWrite:
		return r.Write, nil
	}
	// As on the Linux mount view: a writable root lets delete (a delete
	// entry lies under its grant's write: checkFiles).
	return r.Write || r.Delete, nil
}

var _ backend.FileOverrides = (*Backend)(nil)

// SetFileOverride gives the held entry e names its override.
func (b *Backend) SetFileOverride(name string, e backend.FileEntry) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[name]
	if !ok {
		return fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	es, _, _, ok := backend.SetOverride(s.files, e)
	if !ok {
		return fmt.Errorf("%w: session %s holds no entry %s", backend.ErrInvalidFileEntry, name, e)
	}
	s.files = es
	return nil
}

var _ backend.PersistentPaths = (*Backend)(nil)

// ForgetPersisted: the model keeps no content of persistent paths; it
// refuses, as the Linux backend does, while a session of the name exists.
func (b *Backend) ForgetPersisted(name string) error {
	if err := backend.ValidSessionName(name); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.sessions[name]; ok {
		return fmt.Errorf("%w: session %s exists: end it first", backend.ErrSessionExists, name)
	}
	return nil
}
