package memory

import (
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The process table (the process class): per session, the Delta's process
// entries, and whether the session is gated (it has held one: see
// agent/backend/process.go). Exec and ProcessBound are the use-time
// checks, evaluated on the entries whose handle chain is live, as the
// Linux backend's exec gate and RLIMIT_NPROC do at the next exec or fork.

// DefaultMaxProcs is the model's host process bound (the Linux backend's
// default RLIMIT_NPROC) when Config.MaxProcs is 0.
const DefaultMaxProcs = 4096

// checkProcess refuses what Apply could not hold: an unknown session, an
// invalid or dead handle, an approve-once handle (an exec gate could
// consume one, but no backend does yet); b.mu held.
func (b *Backend) checkProcess(name string, es []backend.ProcessEntry) error {
	if len(es) == 0 {
		return nil
	}
	if _, ok := b.sessions[name]; !ok {
		return fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	for _, e := range es {
		h, err := b.readHandle(e.Handle)
		if err != nil {
			return err
		}
		if h.state == backend.HandleOnce {
			return fmt.Errorf("%w: an approve-once handle for %s", backend.ErrNotSupported, e)
		}
	}
	return nil
}

// addProcess adds the entries s lacks and gates s; b.mu held.
func (s *session) addProcess(es []backend.ProcessEntry) {
	for _, e := range es {
		if !slices.Contains(s.process, e) {
			s.process = append(s.process, e)
		}
	}
	if len(es) > 0 {
		s.gated = true
	}
}

// removeProcess drops es from s (those absent are no error); s stays
// gated; b.mu held.
func (s *session) removeProcess(es []backend.ProcessEntry) {
	s.process = slices.DeleteFunc(s.process, func(e backend.ProcessEntry) bool { return slices.Contains(es, e) })
}

// liveProcess is s's entries whose handle chain is live; b.mu held.
func (b *Backend) liveProcess(s *session) []backend.ProcessEntry {
	return slices.DeleteFunc(slices.Clone(s.process), func(e backend.ProcessEntry) bool { return b.handleCheck(e.Handle, useNew) != backend.ReasonNone })
}

func (b *Backend) maxProcs() uint32 {
	if b.cfg.MaxProcs != 0 {
		return b.cfg.MaxProcs
	}
	return DefaultMaxProcs
}

// Exec is the decision for the next exec of the program at path (resolved)
// by a process of session name: any program in an ungated session, else
// only one a live entry names.
func (b *Backend) Exec(name, path string) (bool, error) {
	if err := (backend.ProcessEntry{Exec: path, Handle: backend.HandleRef{Slot: 1}}).Validate(); err != nil {
		return false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[name]
	if !ok {
		return false, nil
	}
	if !s.gated {
		return true, nil
	}
	return backend.ExecAllowed(b.liveProcess(s), path), nil
}

// ProcessBound is the number of processes session name may have now: the
// host's bound in an ungated session, else backend.ProcessBound of its
// live entries.
func (b *Backend) ProcessBound(name string) (uint32, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[name]
	if !ok {
		return 0, fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	if !s.gated {
		return b.maxProcs(), nil
	}
	return backend.ProcessBound(b.liveProcess(s), b.maxProcs()), nil
}
