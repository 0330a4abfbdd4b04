package capability

// The use-time vocabulary: a request (UseRequest), the answer an enforcer
// gets (UseDecision), the ops of each class, and Allows, the grammar's own
// meaning of a capability for one request.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// UseRequest is one use-time question: may the session do this now?
type UseRequest struct {
	Class  Class      `json:"class"`
	Op     string     `json:"op"`               // connect | accept | read | write | paste_in | copy_out | use | pkg | any | persist | broker | camera | mic | usb | input_inject
	Domain string     `json:"domain,omitempty"` // net.egress by name
	IP     netip.Addr `json:"ip,omitzero"`      // net.egress by address; net.inbound: the peer
	Port   uint16     `json:"port,omitempty"`   // net.egress: the peer's; net.inbound: the session's own
	Path   string     `json:"path,omitempty"`
	Item   string     `json:"item,omitempty"` // gpu device, broker scope, usb id
	Mode   string     `json:"mode,omitempty"` // gpu mode
}

// Validate checks the request's shape.
func (r UseRequest) Validate() error {
	if _, err := ParseClass(string(r.Class)); err != nil {
		return err
	}
	if r.Op == "" {
		return fmt.Errorf("%w: request without op", ErrInvalidCapability)
	}
	if r.Path != "" {
		if err := ValidatePath(r.Path); err != nil {
			return err
		}
	}
	if r.Domain != "" {
		if err := ValidateDomainPattern(r.Domain); err != nil || strings.HasPrefix(r.Domain, "*") {
			return fmt.Errorf("%w: request domain %q", ErrInvalidCapability, r.Domain)
		}
	}
	return nil
}

// UseDecision is a use-time answer for an enforcer that asks before it acts
// (the tool runner, the resolver, a future proxy): the capabilities.md
// queries may_egress, may_path, may_dispatch, may_exec ... are UseRequests
// of the matching class and op.
type UseDecision struct {
	Session string     `json:"session"`
	Request UseRequest `json:"request"`
	Allowed bool       `json:"allowed"`
	// DecidedBy is the rule that decided: the permit that allowed (a
	// "grant:<id>" policy is a live grant; any other id is a shipped or
	// admin policy), the forbid that denied (forbids override), or
	// "default-deny" when no permit matched.
	DecidedBy string   `json:"decided_by"`
	Reasons   []string `json:"reasons,omitempty"`
	Errors    []string `json:"errors,omitempty"`
}

// DefaultDeny names the rule of a denial no forbid made: nothing permitted it.
const DefaultDeny = "default-deny"

// Ops lists the use-time ops of class c, as UseRequest.Op names them (nil
// for an unknown class).
func Ops(c Class) []string {
	if s := specOf(c); s != nil {
		return slices.Clone(s.ops)
	}
	return nil
}

// Allows is the grammar's own (Go) meaning of a capability: does it cover
// this use-time request? The grant-time check compares it with what the
// grant's Cedar policy permits.
func (c Capability) Allows(r UseRequest) bool {
	if c.Class != r.Class {
		return false
	}
	s := specOf(c.Class)
	if s == nil {
		return false
	}
	return s.allows(c.Normalized(), r)
}
