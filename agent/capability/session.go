package capability

// Sessions as callers see them: the spec a session is created with and its
// denial circuit breaker.

import (
	"fmt"
	"slices"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// SessionSpec describes a session at creation.
type SessionSpec struct {
	ID            string `json:"id"` // also the kernel session (cgroup) name
	Image         string `json:"image"`
	TrustTier     string `json:"trust_tier"` // low | normal | high; default normal
	Risk          string `json:"risk"`       // normal | high; default normal
	Headless      bool   `json:"headless"`
	TLSInspection bool   `json:"tls_inspection"`
	Home          string `json:"home,omitempty"`      // for the protected-path forbids
	Workspace     string `json:"workspace,omitempty"` // the tier table's working tree; with Mode, part of the session's view
	// Mode is the workspace's confinement mode: "" (the workspace names the
	// tier table's working tree only and is not added to the session's
	// view), backend.ModeReadOnly or backend.ModeWorkspaceWrite.
	Mode    string    `json:"mode,omitempty"`
	Expires time.Time `json:"expires,omitzero"` // session end; zero: none
	// Quotas are the session's resource bounds, set by the backend with the
	// session (all or nothing) and kept in the record, so a restarted agent
	// knows them.
	Quotas backend.Limits `json:"quotas,omitzero"`
}

// Normalize fills the defaults (trust tier and risk "normal") and checks the
// spec: a valid session name, a plain image token, known trust tier and
// risk, absolute clean paths. A spec asking for TLS inspection is refused
// (ErrTLSInspection); every other error wraps ErrInvalidRequest.
func (s *SessionSpec) Normalize() error {
	if err := backend.ValidSessionName(s.ID); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if s.TLSInspection {
		return ErrTLSInspection
	}
	if err := ValidateToken("image", s.Image); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if s.TrustTier == "" {
		s.TrustTier = "normal"
	}
	if s.Risk == "" {
		s.Risk = "normal"
	}
	if !slices.Contains([]string{"low", "normal", "high"}, s.TrustTier) {
		return fmt.Errorf("%w: trust tier %q", ErrInvalidRequest, s.TrustTier)
	}
	if !slices.Contains([]string{"normal", "high"}, s.Risk) {
		return fmt.Errorf("%w: risk %q", ErrInvalidRequest, s.Risk)
	}
	switch s.Mode {
	case "":
	case backend.ModeReadOnly, backend.ModeWorkspaceWrite:
		if s.Workspace == "" {
			return fmt.Errorf("%w: mode %q needs a workspace", ErrInvalidRequest, s.Mode)
		}
	case "full-access":
		return fmt.Errorf("%w: mode full-access is not offered: a session's view is the host read-only plus its workspace", ErrInvalidRequest)
	default:
		return fmt.Errorf("%w: mode %q: %s or %s", ErrInvalidRequest, s.Mode, backend.ModeReadOnly, backend.ModeWorkspaceWrite)
	}
	for _, p := range []string{s.Home, s.Workspace} {
		if p != "" {
			if err := ValidatePath(p); err != nil {
				return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
			}
		}
	}
	return nil
}

// BreakerState is a session's denial circuit breaker.
type BreakerState struct {
	Consecutive int  `json:"consecutive"`
	Total       int  `json:"total"`
	Tripped     bool `json:"tripped"`
}
