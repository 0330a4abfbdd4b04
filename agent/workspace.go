package agent

// A session's workspace: the directory made part of its view (read-only or
// writable) when it is created, with the paths inside it that stay
// read-only.

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// WorkspaceProtected are the paths, relative to a workspace, that stay
// read-only in a session's view whatever its mode: what a host user's git
// would execute or obey (hooks, config) if a session rewrote it.
var WorkspaceProtected = []string{".git/hooks", ".git/config"}

// workspaceOf is the backend's workspace of spec (nil without a mode): the
// protected paths are WorkspaceProtected, Config.WorkspaceProtected and
// every protected path and policy-store directory of the session's
// attributes (the agent's state, policy and manifest directories, the
// home's credential and shell files) that lies inside it. A workspace
// inside one of those (or equal to it) is refused.
func (a *Agent) workspaceOf(spec SessionSpec) (*backend.Workspace, error) {
	if spec.Mode == "" {
		return nil, nil
	}
	dir := spec.Workspace
	w := &backend.Workspace{Dir: dir, Mode: spec.Mode}
	attrs := a.sessionAttrs(spec)
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			w.Protected = append(w.Protected, p)
		}
	}
	for _, rel := range append(append([]string(nil), WorkspaceProtected...), a.cfg.WorkspaceProtected...) {
		p := filepath.Join(dir, rel)
		if !strings.HasPrefix(p, dir+"/") {
			return nil, fmt.Errorf("%w: workspace protected path %q leaves the workspace", ErrInvalidRequest, rel)
		}
		add(p)
	}
	for _, p := range append(append([]string(nil), attrs.Protected...), attrs.PolicyStore...) {
		switch {
		case p == dir || strings.HasPrefix(dir, p+"/"):
			return nil, fmt.Errorf("%w: workspace %s lies in the protected path %s", ErrInvalidRequest, dir, p)
		case strings.HasPrefix(p, dir+"/"):
			add(p)
		}
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return w, nil
}

// ensureWorkspace puts spec's workspace back into its session's view where
// the backend lost it (WorkspaceViews).
func (a *Agent) ensureWorkspace(spec SessionSpec) error {
	w, err := a.workspaceOf(spec)
	if err != nil || w == nil {
		return err
	}
	v, ok := a.kernel.(backend.WorkspaceViews)
	if !ok {
		return nil
	}
	if err := v.EnsureWorkspace(spec.ID, *w); err != nil {
		return fmt.Errorf("%w: session %s: workspace: %w", ErrKernel, spec.ID, err)
	}
	return nil
}

// ForgetPersisted removes what sessions named name kept in their
// persistent paths (persistence with survives_session). Refused while a
// session of that name exists, and where the backend keeps none.
func (a *Agent) ForgetPersisted(name string) error {
	if err := backend.ValidSessionName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	a.mu.Lock()
	defer a.unlock()
	if _, ok := a.st.Sessions[name]; ok {
		return fmt.Errorf("%w: %q: end the session first", ErrSessionExists, name)
	}
	p, ok := a.kernel.(backend.PersistentPaths)
	if !ok {
		return fmt.Errorf("%w: this backend keeps no persistent paths", ErrNotEnforceable)
	}
	if err := p.ForgetPersisted(name); err != nil {
		return fmt.Errorf("%w: forget %s: %w", ErrKernel, name, err)
	}
	return a.emit(Event{Kind: "persist.forget", Session: name, Outcome: "ok"})
}
