package dataplane

import (
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// What a revoke reaches. A revoke kills one handle and, through the parent
// walk every check makes, each handle attenuated from it. A handle's chain
// is fixed when it is issued (newHandle), so the dataplane keeps each
// slot's parent in memory (handleUp, filled from the handle map at start)
// and tells which entries a revoke killed without reading the map. The
// file views and exec gates derived again after a revoke are then those of
// the sessions holding such an entry, not every session's (a revoke used to
// cost every view-holding session a derivation: 5 ms at 200 sessions).

// reachedLocked says whether a revoke of dead kills ref (backend.Reaches
// over handleUp: a slot issued again since counts as reached, and the
// caller derives its session again, which is never wrong, only work).
// d.mu held.
func (d *Dataplane) reachedLocked(ref, dead HandleRef) bool {
	return backend.Reaches(ref, dead, MaxChain, func(r HandleRef) (HandleRef, bool) {
		if r.Slot >= uint32(len(d.handleGen)) || d.handleGen[r.Slot] != r.Generation {
			return HandleRef{}, false
		}
		return d.handleUp[r.Slot], true
	})
}

// reachedSessionsLocked returns, sorted, the sessions among entries' keys
// holding an entry whose handle (handleOf) a revoke of dead kills. d.mu
// held.
func reachedSessionsLocked[E any](d *Dataplane, entries map[string][]E, only map[string]bool, dead HandleRef, handleOf func(E) HandleRef) []string {
	var names []string
	for n, es := range entries {
		if only != nil && !only[n] {
			continue
		}
		for _, e := range es {
			if d.reachedLocked(handleOf(e), dead) {
				names = append(names, n)
				break
			}
		}
	}
	slices.Sort(names)
	return names
}
