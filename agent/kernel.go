package agent

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// Kernel is the OS seam the agent drives: one backend.Backend per host. The
// agent owns the backend's sessions and handle table: on start it revokes
// kernel handles and removes egress rules that its state does not account
// for.
type Kernel = backend.Backend

// Enforcement reports, per capability class, the mechanism and strength the
// backend found on this host (principle 2 of DESIGN.md: honest
// degradation). A class is grantable exactly when its level enforces
// something.
func (a *Agent) Enforcement() []Enforcement {
	rep := a.kernel.Probe()
	out := make([]Enforcement, 0, len(Classes))
	for _, c := range Classes {
		s := rep.Class(c)
		out = append(out, Enforcement{Class: c, Grantable: s.Level.Enforceable(), Level: s.Level, Mechanism: s.Mechanism, Reason: s.Reason})
	}
	return out
}

func (a *Agent) enforceable(c Capability) error {
	if err := capability.Unenforced(c); err != nil {
		return err
	}
	s := a.kernel.Probe().Class(c.Class)
	if !s.Level.Enforceable() {
		return fmt.Errorf("%w: %s is %s here: %s", ErrNotEnforceable, c.Class, s.Level, s.Reason)
	}
	return nil
}
