package capability

// What this host can enforce, per class, and the refusals that follow from
// it.

import (
	"errors"
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
)

// ErrNotEnforceable is returned for a grant of a class this host cannot
// enforce: the grant is refused rather than issued as an advisory promise.
var ErrNotEnforceable = errors.New("agent: the host cannot enforce this capability class")

// Enforcement says how one class is enforced on this host, as the backend
// probed it when it opened.
type Enforcement struct {
	Class     Class         `json:"class"`
	Grantable bool          `json:"grantable"`
	Level     backend.Level `json:"level"`
	Mechanism string        `json:"mechanism"`
	Reason    string        `json:"reason,omitempty"`
}

// ErrTLSInspection: TLS inspection is asked for (a session's
// tls_inspection, an egress grant's tls_inspect) but no proxy on this host
// inspects anything; accepting the flag would promise what nothing keeps.
var ErrTLSInspection = fmt.Errorf("%w: tls inspection: not enforceable on this host (no TLS-inspecting proxy runs here)", ErrNotEnforceable)

// Unenforced refuses a capability that asks for something no backend
// enforces yet, whatever the host's probe says (net.egress tls_inspect: no
// TLS-inspecting proxy runs, ErrTLSInspection); nil otherwise.
func Unenforced(c Capability) error {
	if s := specOf(c.Class); s != nil && s.unenforced != nil && s.has(&c) {
		return s.unenforced(c)
	}
	return nil
}
