package agent

import (
	"errors"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestWorkspaceSpec: a session's workspace and mode reach the backend with
// the session (Limits.Workspace), with the protected paths inside it (git's
// hooks and config, the configured ones, the agent's own files); bad modes
// and a workspace inside the agent's files are refused before anything
// exists; the record keeps the mode across a restart.
func TestWorkspaceSpec(t *testing.T) {
	m := newMemoryAgent(t, func(c *Config) { c.WorkspaceProtected = []string{".shinken.toml"} })
	for _, bad := range []SessionSpec{
		{ID: "b1", Mode: backend.ModeWorkspaceWrite},                   // no workspace
		{ID: "b2", Workspace: "/work", Mode: "full-access"},            // not offered
		{ID: "b3", Workspace: "/work", Mode: "rw"},                     // unknown
		{ID: "b4", Workspace: m.dir, Mode: backend.ModeWorkspaceWrite}, // the agent's state
		{ID: "b5", Workspace: "/usr/bin", Mode: backend.ModeReadOnly},  // a protected path
	} {
		err := m.CreateSession(bad)
		if !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: %v, want ErrInvalidRequest", bad, err)
		}
		if _, ok := m.Session(bad.ID); ok {
			t.Errorf("%s exists after a refused create", bad.ID)
		}
	}
	mustSession(t, m.Agent, SessionSpec{ID: "w", Workspace: "/work", Mode: backend.ModeWorkspaceWrite, Home: "/work/home"})
	l, err := m.b.SessionLimits("w")
	if err != nil || l.Workspace == nil {
		t.Fatalf("backend limits: %+v %v", l, err)
	}
	if l.Workspace.Dir != "/work" || l.Workspace.Mode != backend.ModeWorkspaceWrite {
		t.Errorf("workspace %+v", *l.Workspace)
	}
	for _, p := range []string{"/work/.git/hooks", "/work/.git/config", "/work/.shinken.toml", "/work/home/.ssh", "/work/home/.bashrc"} {
		if !slices.Contains(l.Workspace.Protected, p) {
			t.Errorf("protected paths %v lack %s", l.Workspace.Protected, p)
		}
	}
	mustSession(t, m.Agent, SessionSpec{ID: "tier-only", Workspace: "/work"})
	if l, _ := m.b.SessionLimits("tier-only"); l.Workspace != nil {
		t.Errorf("a workspace without a mode reached the view: %+v", *l.Workspace)
	}
	m.reopen(t)
	if s, ok := m.Session("w"); !ok || s.Mode != backend.ModeWorkspaceWrite || s.Workspace != "/work" {
		t.Errorf("after a restart: %+v %v", s, ok)
	}
}
