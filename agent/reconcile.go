package agent

import (
	"errors"
	"fmt"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// ReconcileReport says what Reconcile repaired.
type ReconcileReport struct {
	RolledBack     []string            `json:"rolled_back,omitempty"`     // grants that never went live, undone
	Revoked        []string            `json:"revoked,omitempty"`         // live grants whose kernel side had drifted, or revocations finished
	OrphanHandles  []backend.HandleRef `json:"orphan_handles,omitempty"`  // kernel handles no live grant accounts for, revoked and freed
	OrphanRules    int                 `json:"orphan_rules,omitempty"`    // kernel egress rules and file entries no live grant accounts for, removed
	OrphanSessions []string            `json:"orphan_sessions,omitempty"` // kernel sessions not in state, destroyed
	EndedSessions  []string            `json:"ended_sessions,omitempty"`  // sessions half-created, half-ended or gone from the kernel
}

// Reconcile makes the kernel and the persisted state agree, always in the
// fail-closed direction: a grant that was not fully live is rolled back; a
// live grant whose handle is not live in the kernel, or whose rules are
// missing, is revoked (never re-applied); a revocation in progress is
// finished; kernel handles, rules and sessions the state does not account
// for are revoked, removed and destroyed. It runs on Open; running it again
// is harmless.
func (a *Agent) Reconcile() (*ReconcileReport, error) {
	a.mu.Lock()
	defer a.unlock()
	rep := &ReconcileReport{}
	var errs []error
	snap, err := a.kernel.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot: %w", ErrKernel, err)
	}
	ks := snap.Sessions
	kernelSessions := make([]string, len(ks))
	inKernelSet := make(map[string]bool, len(ks)) // a lookup per record: 10,000 sessions are 10^8 compares as a list scan
	for i, s := range ks {
		kernelSessions[i] = s.Name
		inKernelSet[s.Name] = true
	}
	// Sessions.
	for _, id := range sortedKeys(a.st.Sessions) {
		rec := a.st.Sessions[id]
		inKernel := inKernelSet[id]
		switch {
		case rec.Phase == SessionCreating:
			// Never returned to a caller: undo.
			if inKernel {
				if err := a.kernel.DestroySession(id); err != nil && !errors.Is(err, backend.ErrSessionNotFound) {
					errs = append(errs, err)
					continue
				}
			}
			delete(a.st.Sessions, id)
			rep.EndedSessions = append(rep.EndedSessions, id)
		case rec.Phase == SessionEnding || !inKernel:
			a.engine.PutSession(a.sessionAttrs(rec.Spec))
			if err := a.endSessionLocked(id, "reconcile: session ending or gone from the kernel"); err != nil {
				errs = append(errs, err)
				continue
			}
			rep.EndedSessions = append(rep.EndedSessions, id)
		default:
			a.engine.PutSession(a.sessionAttrs(rec.Spec))
			if err := a.ensureWorkspace(rec.Spec); err != nil {
				errs = append(errs, err)
			}
			a.bmu.Lock()
			if a.breaker[id] == nil {
				b := rec.Breaker
				a.breaker[id] = &b
			}
			a.bmu.Unlock()
		}
	}
	for _, name := range kernelSessions {
		if _, ok := a.st.Sessions[name]; !ok {
			if err := a.kernel.DestroySession(name); err != nil && !errors.Is(err, backend.ErrSessionNotFound) {
				errs = append(errs, err)
				continue
			}
			rep.OrphanSessions = append(rep.OrphanSessions, name)
		}
	}
	// Grants.
	handles := snap.Handles
	bySlot := map[uint32]backend.Handle{}
	for _, h := range handles {
		bySlot[h.Ref.Slot] = h
	}
	kernelLive := func(ref backend.HandleRef) bool {
		h, ok := bySlot[ref.Slot]
		return ok && h.Ref == ref && h.State.Alive()
	}
	for _, g := range a.sortedGrants() {
		switch g.Phase {
		case PhasePending, PhaseHandle, PhaseApplying:
			if err := a.rollback(g, errors.New("reconcile: grant was not live when the agent stopped")); err != nil && g.Phase != PhaseRolledBack {
				errs = append(errs, err)
			}
			rep.RolledBack = append(rep.RolledBack, g.ID)
		case PhaseRevoking:
			if err := a.revokeLocked(g, "reconcile: finish revocation"); err != nil {
				errs = append(errs, err)
			}
			rep.Revoked = append(rep.Revoked, g.ID)
		case PhaseLive:
			drift := ""
			if _, ok := a.st.Sessions[g.Session]; !ok {
				drift = "session gone"
			} else if !kernelLive(g.Kernel) {
				drift = "kernel handle not live"
			} else if m := g.Delta.Missing(snap.Deltas[g.Session]); m != "" {
				drift = "kernel entry missing: " + m
			}
			if drift != "" {
				if err := a.revokeLocked(g, "reconcile: "+drift); err != nil {
					errs = append(errs, err)
				}
				rep.Revoked = append(rep.Revoked, g.ID)
				continue
			}
			gd := GrantData{ID: g.ID, Session: g.Session, Capability: g.Capability, Expires: g.Expires}
			if g.Lifecycle == LifecycleOnce {
				gd.Once = g.Kernel
			}
			if err := a.engine.PutGrant(gd); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Kernel handles no live grant accounts for: revoke and free.
	live := map[backend.HandleRef]bool{}
	for _, g := range a.st.Grants {
		if g.Phase == PhaseLive {
			live[g.Kernel] = true
		}
	}
	// What the steps above left: a second snapshot.
	if snap, err = a.kernel.Snapshot(); err != nil {
		errs = append(errs, fmt.Errorf("%w: snapshot: %w", ErrKernel, err))
	}
	handles = snap.Handles
	// Children before parents, so a slot is never freed under a live child.
	slices.SortFunc(handles, func(x, y backend.Handle) int {
		if x.Parent.IsZero() != y.Parent.IsZero() {
			if x.Parent.IsZero() {
				return 1
			}
			return -1
		}
		return 0
	})
	for _, h := range handles {
		if h.State == backend.HandleFree || live[h.Ref] {
			continue
		}
		if h.State.Alive() {
			if err := a.kernel.Revoke(h.Ref); err != nil && !handleGone(err) {
				errs = append(errs, err)
				continue
			}
		}
		if err := a.kernel.Release("", h.Ref, backend.Delta{}); err != nil && !handleGone(err) {
			errs = append(errs, err)
			continue
		}
		rep.OrphanHandles = append(rep.OrphanHandles, h.Ref)
	}
	// Kernel rules no live grant of their session accounts for.
	for id, s := range a.st.Sessions {
		if s.Phase != SessionActive {
			continue
		}
		for _, r := range snap.Deltas[id].AddressRules() {
			if a.ruleAccounted(id, r) {
				continue
			}
			if err := a.kernel.Release(id, backend.HandleRef{}, backend.DeltaOf([]backend.EgressRule{r})); err != nil && !errors.Is(err, backend.ErrRuleNotFound) {
				errs = append(errs, err)
				continue
			}
			rep.OrphanRules++
		}
		// File entries (fs.scope) no live grant of the session accounts
		// for: their view goes with them.
		for _, e := range snap.Deltas[id].Files {
			if a.fileAccounted(id, e) {
				continue
			}
			if err := a.kernel.Release(id, backend.HandleRef{}, backend.Delta{Files: []backend.FileEntry{e}}); err != nil {
				errs = append(errs, err)
				continue
			}
			rep.OrphanRules++
		}
	}
	errs = append(errs, a.persist())
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("agent: reconcile: %w", err)
	}
	if len(rep.RolledBack)+len(rep.Revoked)+len(rep.OrphanHandles)+rep.OrphanRules+len(rep.OrphanSessions)+len(rep.EndedSessions) > 0 {
		a.emit(Event{Kind: "reconcile.repair", Outcome: fmt.Sprintf("%+v", *rep)})
	}
	return rep, nil
}

func (a *Agent) ruleAccounted(session string, r backend.EgressRule) bool {
	for _, g := range a.st.Grants {
		if g.Session == session && g.Phase == PhaseLive && g.Kernel == r.Handle {
			if backend.DeltaOf([]backend.EgressRule{r}).Missing(g.Delta) == "" {
				return true
			}
			// A DNS-derived entry (it carries the record's TTL) under a
			// live grant that names domains.
			if !r.Expires.IsZero() && g.Capability.Class == ClassNetEgress && len(g.Capability.Egress.Domains) > 0 {
				return true
			}
		}
	}
	return false
}

// fileAccounted: a live grant of session holds e in its Delta.
func (a *Agent) fileAccounted(session string, e backend.FileEntry) bool {
	for _, g := range a.st.Grants {
		if g.Session == session && g.Phase == PhaseLive && g.Kernel == e.Handle && (backend.Delta{Files: []backend.FileEntry{e}}).Missing(g.Delta) == "" {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
