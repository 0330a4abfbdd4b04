package capability

import "errors"

// Errors more than one layer returns: the agent all three, the policy
// engine ErrUnknownSession; the API maps them to statuses. The grammar's
// own errors are beside the code that returns them (ErrInvalidCapability and
// ErrWidens in capability.go, ErrManifest and ErrOutsideManifest in
// manifest.go, ErrNotEnforceable and ErrTLSInspection in enforcement.go).
var (
	ErrInvalidRequest = errors.New("agent: invalid request")
	ErrUnknownSession = errors.New("agent: unknown session")
	ErrDenied         = errors.New("agent: denied by policy")
)
