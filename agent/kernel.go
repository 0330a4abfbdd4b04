package agent

import (
	"fmt"

	"github.com/shinken-agent/shinken/agent/backend"
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
	if c.Class == ClassNetEgress && c.Egress != nil && c.Egress.TLSInspect {
		return ErrTLSInspection
	}
	s := a.kernel.Probe().Class(c.Class)
	if !s.Level.Enforceable() {
		return fmt.Errorf("%w: %s is %s here: %s", ErrNotEnforceable, c.Class, s.Level, s.Reason)
	}
	return nil
}

// ClassEntry is one capability class's entry in the registry: how a
// capability of the class compiles to its section of a backend.Delta. The
// agent loops over the registry; a class without an entry compiles to
// nothing of its own (its enforcement, if any, is the backend's probe row:
// a class is grantable only where that row enforces something).
type ClassEntry struct {
	Class Class
	// Compile turns a normalized capability of the class into the Delta
	// the grant's handle ref carries.
	Compile func(c Capability, ref backend.HandleRef) backend.Delta
}

// registry holds the classes that compile to OS state, by class.
var registry = map[Class]ClassEntry{
	ClassNetEgress:  {Class: ClassNetEgress, Compile: compileEgress},
	ClassNetInbound: {Class: ClassNetInbound, Compile: compileInbound},
}

// compile is a capability's Delta under ref (empty for a class with no
// OS state of its own).
func compile(c Capability, ref backend.HandleRef) backend.Delta {
	c = c.Normalized()
	if e, ok := registry[c.Class]; ok {
		return e.Compile(c, ref)
	}
	return backend.Delta{}
}

// compileEgress: every cidr × every port range (any port when none), any
// transport, all carried by the grant's handle. Domains compile to nothing
// here: the allowlisting resolver turns their answers into rules under the
// same handle.
func compileEgress(c Capability, ref backend.HandleRef) backend.Delta {
	var d backend.Delta
	for _, p := range c.Egress.CIDRs {
		for _, pr := range kernelPorts(c.Egress.Ports) {
			d.Egress = append(d.Egress, backend.EgressRule{Prefix: p, Proto: backend.ProtoAny, Ports: pr, Handle: ref})
		}
	}
	return d
}

// compileInbound: every cidr (where a peer connects from) × every port range
// (the session's own ports; any when none), any transport, marked Inbound.
func compileInbound(c Capability, ref backend.HandleRef) backend.Delta {
	var d backend.Delta
	for _, p := range c.Inbound.CIDRs {
		for _, pr := range kernelPorts(c.Inbound.Ports) {
			d.Inbound = append(d.Inbound, backend.EgressRule{Prefix: p, Proto: backend.ProtoAny, Ports: pr, Handle: ref, Inbound: true})
		}
	}
	return d
}

// kernelPorts is a scope's ports as kernel ranges: any port when none.
func kernelPorts(ports []PortRange) []backend.PortRange {
	if len(ports) == 0 {
		return []backend.PortRange{backend.AnyPort}
	}
	out := make([]backend.PortRange, 0, len(ports))
	for _, p := range ports {
		out = append(out, backend.PortRange{Lo: p.Lo, Hi: p.Hi})
	}
	return out
}
