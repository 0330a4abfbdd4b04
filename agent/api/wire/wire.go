package wire

import (
	"encoding/json"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// ---- requests, grants (POST /v1/requests, /v1/revoke, /v1/attenuate) ----

// RequestBody asks for one or more capabilities. Requests that need a human
// are batched into cards: one card per session and tier.
type RequestBody struct {
	Requests []capability.GrantRequest `json:"requests"`
}

// RequestResult is the outcome of one request.
type RequestResult struct {
	Outcome string            `json:"outcome"` // granted | pending | denied | invalid
	Grant   *capability.Grant `json:"grant,omitempty"`
	Card    string            `json:"card,omitempty"`
	Reason  string            `json:"reason,omitempty"`
	Status  int               `json:"status"`
}

// RevokeBody names a grant by handle token or by grant id.
type RevokeBody struct {
	Handle string `json:"handle,omitempty"`
	ID     string `json:"id,omitempty"`
}

// AttenuateBody derives a narrower grant from Parent (a handle token).
type AttenuateBody struct {
	Parent  string                  `json:"parent"`
	Request capability.GrantRequest `json:"request"`
}

// ---- approval cards (POST /v1/cards/{id}/approve) ----

// ApproveBody says how far an approval reaches.
type ApproveBody struct {
	Mode string `json:"mode"` // once | session | pattern
}

// ---- decisions and policy (POST /v1/decide, /v1/policies) ----

// DecideBody is one use-time question.
type DecideBody struct {
	Session string                `json:"session"`
	Request capability.UseRequest `json:"request"`
}

// PolicyBody proposes policy files. Apply false: a diff (nothing changes).
type PolicyBody struct {
	Files         map[string]string `json:"files"`
	Apply         bool              `json:"apply"`
	AllowWidening bool              `json:"allow_widening,omitempty"`
}

// PolicyResult is the gate's answer; Error is set when the change was refused.
type PolicyResult struct {
	*capability.PolicyReport
	Error string `json:"error,omitempty"`
}

// ---- sessions (/v1/sessions) ----

// CreateSessionBody is a session spec; its Quotas are set with the session.
type CreateSessionBody = capability.SessionSpec

// SessionView is a session as the API shows it.
type SessionView struct {
	capability.SessionSpec
	Index    uint32  `json:"index"`
	CgroupID uint64  `json:"cgroup_id"`
	Path     string  `json:"cgroup"`
	UID      *uint32 `json:"uid,omitempty"` // its processes' default uid
	// Holder: the process that holds the session's namespaces runs
	// (started at its first launch, file get or put, or process grant);
	// absent where the backend keeps none.
	Holder  *bool                          `json:"holder,omitempty"`
	Denials map[string]uint64              `json:"denials,omitempty"`
	Grants  []capability.GrantInfo         `json:"grants,omitempty"`
	Breaker *capability.BreakerState       `json:"breaker,omitempty"`
	Domains map[string][]backend.HandleRef `json:"domains,omitempty"`
	// Paused: the session is frozen (POST .../pause), since PausedSince
	// when this agent paused it.
	Paused      bool       `json:"paused,omitempty"`
	PausedSince *time.Time `json:"paused_since,omitempty"`
}

// RunRequest runs a command inside a session.
type RunRequest struct {
	Argv     []string `json:"argv"`
	Stdin    string   `json:"stdin,omitempty"`
	TimeoutS float64  `json:"timeout_s,omitempty"` // default 60, at most 3600
	UID      uint32   `json:"uid,omitempty"`       // default: the session's own uid; never 0
	GID      uint32   `json:"gid,omitempty"`
}

// RunResult is what the command did.
type RunResult struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	PID       int    `json:"pid"`
	// Process is the run's process id (GET .../processes/{pid}); Running
	// says the request's deadline passed first: the process goes on.
	Process string `json:"process,omitempty"`
	Running bool   `json:"running,omitempty"`
}

// ---- events (GET /v1/events, NDJSON) ----

// Record is one entry of the event stream: an agent lifecycle event (Data
// is a capability.Event), a kernel denial or an API notice.
type Record struct {
	Time   time.Time       `json:"time"`
	Source string          `json:"source"` // "agent" | "kernel" | "api"
	Kind   string          `json:"kind"`
	Data   json.RawMessage `json:"data"`
}

// ---- errors ----

// Error is the body of every non-2xx response.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}
