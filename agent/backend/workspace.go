package backend

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Confinement modes of a session's workspace.
const (
	// ModeReadOnly: the workspace is visible in the session's view, read
	// only, its files shown as the session's own.
	ModeReadOnly = "read-only"
	// ModeWorkspaceWrite: the workspace is writable from the session (at
	// the same path), its files shown as the session's own and the
	// session's new files kept as the directory owner's on disk; its
	// Protected subpaths stay read-only.
	ModeWorkspaceWrite = "workspace-write"
)

// Workspace is a session's working tree: a host directory made part of the
// session's view at the same path when the session is created.
type Workspace struct {
	Dir  string `json:"dir"`  // absolute, clean; an existing directory reached through no symbolic link
	Mode string `json:"mode"` // ModeReadOnly or ModeWorkspaceWrite
	// Protected are paths under Dir that stay read-only in the session's
	// view whatever the mode (.git/hooks, .git/config, the agent's own
	// files): those that exist when the view is made.
	Protected []string `json:"protected,omitempty"`
}

// Validate checks the form of w (not the host: a backend checks that the
// directory exists): an absolute clean Dir other than /, a known mode,
// protected paths strictly under Dir.
func (w Workspace) Validate() error {
	if !filepath.IsAbs(w.Dir) || filepath.Clean(w.Dir) != w.Dir || w.Dir == "/" {
		return fmt.Errorf("%w: workspace %q: an absolute clean path other than /", ErrInvalidSession, w.Dir)
	}
	switch w.Mode {
	case ModeReadOnly, ModeWorkspaceWrite:
	default:
		return fmt.Errorf("%w: workspace mode %q: %s or %s", ErrInvalidSession, w.Mode, ModeReadOnly, ModeWorkspaceWrite)
	}
	for _, p := range w.Protected {
		if filepath.Clean(p) != p || !strings.HasPrefix(p, w.Dir+"/") {
			return fmt.Errorf("%w: workspace protected path %q: a clean path under %s", ErrInvalidSession, p, w.Dir)
		}
	}
	return nil
}
