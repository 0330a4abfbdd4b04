package agent

// Sessions: the unit a grant is made for. Create (intent recorded, then the
// backend session), end (every grant revoked, membrane included, then the
// backend session destroyed) and list.

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/store"
)

func (a *Agent) sessionAttrs(s SessionSpec) SessionAttrs {
	// The policy store: agent state, admin policies and image manifests.
	store := []string{filepath.Clean(a.cfg.StateDir)}
	for _, d := range []string{a.cfg.PolicyDir, a.cfg.ManifestDir} {
		if d != "" {
			if abs, err := filepath.Abs(d); err == nil {
				store = append(store, abs)
			}
		}
	}
	return SessionAttrs{ID: s.ID, Image: s.Image, TrustTier: s.TrustTier, Risk: s.Risk, Headless: s.Headless, TLSInspection: s.TLSInspection,
		Protected: DefaultProtected(s.Home), PolicyStore: store}
}

// CreateSession creates the session in the backend, with its quotas (a
// quota the host cannot enforce refuses the session before anything
// exists), and records it.
func (a *Agent) CreateSession(spec SessionSpec) error {
	if err := spec.Normalize(); err != nil {
		return err
	}
	lim := spec.Quotas
	ws, err := a.workspaceOf(spec)
	if err != nil {
		return err
	}
	lim.Workspace = ws
	// Quotas (and a workspace) the host cannot enforce are refused before
	// anything exists.
	if err := a.kernel.CheckLimits(lim); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.unlock()
	if _, ok := a.st.Sessions[spec.ID]; ok {
		return fmt.Errorf("%w: %q", ErrSessionExists, spec.ID)
	}
	rec := &SessionRecord{Spec: spec, Phase: SessionCreating, Created: a.cfg.Now()}
	a.st.Sessions[spec.ID] = rec
	a.due.noteSession(spec.ID, rec)
	// The creating record is not persisted (an fsync per create): after a
	// crash before the active record below is, the kernel's session has no
	// record, and Reconcile destroys it as an orphan, as it undoes a
	// persisted creating record (state files of earlier agents).
	key := store.SessionKey(spec.ID)
	a.crash(StepSessionIntent)
	if _, err := a.kernel.CreateSession(spec.ID, lim); err != nil {
		delete(a.st.Sessions, spec.ID)
		return errors.Join(fmt.Errorf("%w: create session %s: %w", ErrKernel, spec.ID, err), a.store.Write([]string{key}, true))
	}
	a.crash(StepSessionKernel)
	// Record the create, then make the session active: its audit record is
	// written (Defer), one commit makes it durable (one fdatasync), and the
	// active record is written and fsynced once it is (Committer; the
	// log's checkpoint trails on its own writer): two syncs in turn, the
	// log's fdatasync and then the journal's. A crash never leaves an
	// active session the audit log does not show; one between the two
	// leaves the kernel's session without a record, which Reconcile
	// destroys as an orphan. Failing to record fails the create.
	rec.Phase = SessionActive
	undo := func(cause error) error {
		delete(a.st.Sessions, spec.ID)
		return errors.Join(cause, a.kernel.DestroySession(spec.ID))
	}
	if err := a.emit(Event{Kind: "session.create", Session: spec.ID, Outcome: "ok", Defer: true}); err != nil {
		return undo(fmt.Errorf("emit: %w", err))
	}
	recorded := false
	if err := a.commit(func() error {
		recorded = true
		a.crash(StepSessionRecorded)
		return a.store.Write([]string{key}, true)
	}); err != nil {
		err = undo(err)
		if recorded {
			// The create's record is durable: the log says it ended.
			err = errors.Join(err, a.emit(Event{Kind: "session.end", Session: spec.ID, Outcome: "rollback: " + err.Error()}))
		}
		return err
	}
	a.bmu.Lock()
	a.breaker[spec.ID] = &BreakerState{}
	a.bmu.Unlock()
	a.engine.PutSession(a.sessionAttrs(spec))
	return nil
}

// EndSession revokes every grant of the session, destroys its cgroup and
// forgets it (pending approvals included). Ending an unknown session is an
// error; ending it twice is not possible.
func (a *Agent) EndSession(id string) error {
	a.mu.Lock()
	defer a.unlock()
	err := a.endSessionLocked(id, "session ended")
	a.syncCards() // its pending cards time out
	return err
}

func (a *Agent) endSessionLocked(id, reason string) error {
	rec, ok := a.st.Sessions[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSession, id)
	}
	// Record the intent; if that fails (a full disk) nothing has changed and
	// the session stays as it was.
	old := rec.Phase
	rec.Phase = SessionEnding
	key := store.SessionKey(id)
	if err := a.persistKeys(key); err != nil {
		rec.Phase = old
		return err
	}
	keys := []string{key}
	var errs []error
	// Oldest first: a root is revoked before its descendants, and revoking
	// it takes its whole subtree (descendants in other sessions included).
	for _, g := range a.sortedOf(id) {
		if !g.Phase.Terminal() {
			errs = append(errs, a.revokeLocked(g, reason))
		}
	}
	for k, ap := range a.st.Approvals {
		if ap.Request.Session == id {
			delete(a.st.Approvals, k)
			keys = append(keys, store.ApprovalKey(k))
		}
	}
	// Approved patterns answer for this session only: a later session that
	// reuses the name must ask again.
	for k, p := range a.st.Patterns {
		if p.Session == id {
			delete(a.st.Patterns, k)
			keys = append(keys, store.PatternKey(k))
		}
	}
	if err := a.kernel.DestroySession(id); err != nil && !errors.Is(err, backend.ErrSessionNotFound) {
		errs = append(errs, fmt.Errorf("%w: destroy session %s: %w", ErrKernel, id, err))
	}
	if err := errors.Join(errs...); err != nil {
		return errors.Join(err, a.persist())
	}
	delete(a.st.Sessions, id)
	if err := a.persistKeys(keys...); err != nil {
		// Kept, ending: a retry of EndSession finishes the removal (every
		// step above is idempotent) once the write goes through.
		a.st.Sessions[id] = rec
		a.due.noteSession(id, rec)
		return err
	}
	a.engine.DropSession(id)
	a.bmu.Lock()
	delete(a.breaker, id)
	delete(a.kdWins, id)
	a.bmu.Unlock()
	a.forgetEscalations(id)
	a.pauses.mu.Lock() // a.mu, then pauses.mu: pause.go never takes them the other way
	delete(a.pauses.since, id)
	delete(a.pauses.inherited, id)
	a.pauses.mu.Unlock()
	return a.emit(Event{Kind: "session.end", Session: id, Outcome: reason})
}

// Session is the spec of the active session id (false if there is none):
// one map lookup, for the API's per-session calls (Sessions copies and
// sorts every session).
func (a *Agent) Session(id string) (SessionSpec, bool) {
	a.mu.Lock()
	defer a.unlock()
	if s, ok := a.st.Sessions[id]; ok && s.Phase == SessionActive {
		return s.Spec, true
	}
	return SessionSpec{}, false
}

// Sessions lists the active sessions' specs, sorted by id.
func (a *Agent) Sessions() []SessionSpec {
	a.mu.Lock()
	defer a.unlock()
	var out []SessionSpec
	for _, s := range a.st.Sessions {
		if s.Phase == SessionActive {
			out = append(out, s.Spec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
