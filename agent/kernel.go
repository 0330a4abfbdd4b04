package agent

import (
	"errors"
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Kernel is the OS seam the agent drives: one backend.Backend per host. The
// agent owns the backend's sessions and handle table: on start it revokes
// kernel handles and removes egress rules that its state does not account
// for.
type Kernel = backend.Backend

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

// Enforcement reports, per capability class, the mechanism and strength the
// backend found on this host (principle 2 of DESIGN.md: honest
// degradation). A class is grantable exactly when its level enforces
// something.
func (a *Agent) Enforcement() []Enforcement {
	rep := a.kernel.Probe()
	out := make([]Enforcement, 0, len(Classes))
	for _, c := range Classes {
		s := rep.Class(string(c))
		out = append(out, Enforcement{Class: c, Grantable: s.Level.Enforceable(), Level: s.Level, Mechanism: s.Mechanism, Reason: s.Reason})
	}
	return out
}

// ErrTLSInspection: TLS inspection is asked for (a session's
// tls_inspection, an egress grant's tls_inspect) but no proxy on this host
// inspects anything; accepting the flag would promise what nothing keeps.
var ErrTLSInspection = fmt.Errorf("%w: tls inspection: not enforceable on this host (no TLS-inspecting proxy runs here)", ErrNotEnforceable)

func (a *Agent) enforceable(c Capability) error {
	if c.Class == ClassNetEgress && c.Egress != nil && c.Egress.TLSInspect {
		return ErrTLSInspection
	}
	s := a.kernel.Probe().Class(string(c.Class))
	if !s.Level.Enforceable() {
		return fmt.Errorf("%w: %s is %s here: %s", ErrNotEnforceable, c.Class, s.Level, s.Reason)
	}
	return nil
}

// egressRules compiles a net.egress capability into kernel rules: every
// cidr × every port range (any port when none), any transport, all carried by
// the grant's handle. Domains compile to nothing here: the allowlisting
// resolver turns their answers into rules under the same handle.
//
// A net.inbound capability compiles to inbound rules: every cidr (where a
// peer connects from) × every port range (the session's own ports; any when
// none), any transport, marked Inbound.
func egressRules(c Capability, ref backend.HandleRef) []backend.EgressRule {
	c = c.Normalized()
	if c.Class == ClassNetInbound {
		var out []backend.EgressRule
		for _, p := range c.Inbound.CIDRs {
			for _, pr := range (&EgressScope{Ports: c.Inbound.Ports}).portRanges() {
				out = append(out, backend.EgressRule{Prefix: p, Proto: backend.ProtoAny, Ports: pr, Handle: ref, Inbound: true})
			}
		}
		return out
	}
	if c.Class != ClassNetEgress {
		return nil
	}
	var out []backend.EgressRule
	for _, p := range c.Egress.CIDRs {
		for _, pr := range c.Egress.portRanges() {
			out = append(out, backend.EgressRule{Prefix: p, Proto: backend.ProtoAny, Ports: pr, Handle: ref})
		}
	}
	return out
}

// portRanges is the scope's ports as kernel ranges: any port when none.
func (s *EgressScope) portRanges() []backend.PortRange {
	if len(s.Ports) == 0 {
		return []backend.PortRange{backend.AnyPort}
	}
	out := make([]backend.PortRange, 0, len(s.Ports))
	for _, p := range s.Ports {
		out = append(out, backend.PortRange{Lo: p.Lo, Hi: p.Hi})
	}
	return out
}
