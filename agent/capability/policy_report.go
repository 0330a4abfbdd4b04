package capability

// Policy changes as callers see them: the change proposed (PolicyChange),
// the permissiveness gate's answer (PolicyReport, ShiftReport) and the
// concrete request that shows a widening (Counterexample), with the session
// attributes it names (SessionAttrs). The gate itself is the policy engine's
// (agent/policy); these types carry no Cedar value.

import (
	"fmt"
	"strings"
	"time"
)

// PolicyChange proposes policy files: base name (*.cedar) -> content. A
// file of the policy directory with the same name is replaced; others stay.
type PolicyChange struct {
	Files map[string]string `json:"files"`
	// AllowWidening applies a change the gate finds wider (or cannot
	// prove not wider); the report, counterexample included, is audited.
	AllowWidening bool   `json:"allow_widening,omitempty"`
	Actor         string `json:"-"`
}

// PolicyReport is the gate's answer to a change.
type PolicyReport struct {
	Applied bool         `json:"applied"`
	Widens  bool         `json:"widens"`
	Summary string       `json:"summary"`
	Shift   *ShiftReport `json:"shift"`
	// Forbids says which of the proposed set's forbids the kernel would
	// enforce (its deny table) and which only Decide and the resolver.
	Forbids *ForbidReport `json:"forbids,omitempty"`
}

// ForbidReport is how a policy set's forbids that can apply to net.egress
// are enforced: in the kernel (compiled into its deny table: no grant
// reaches what they name, by IP or by name), or at decide time only
// (/v1/decide and the resolver refuse; a session holding a broader grant
// still connects by IP).
type ForbidReport struct {
	InKernel       []string           `json:"in_kernel,omitempty"`
	DecideTimeOnly []DecideOnlyForbid `json:"decide_time_only,omitempty"`
}

// DecideOnlyForbid is one forbid enforced at decide time only, and why the
// kernel cannot enforce it.
type DecideOnlyForbid struct {
	ID    string `json:"id"`
	Where string `json:"where,omitempty"` // file:line
	Why   string `json:"why"`
}

// ShiftReport is the result of a permissiveness-shift check.
type ShiftReport struct {
	// Proved is true when the edit is non-widening by construction: every
	// policy it adds is a forbid and every policy it removes is a permit.
	// (Cedar is deny-by-default with forbid-overrides, so such an edit can
	// only turn Allow into Deny; this holds for every request.)
	Proved bool
	// Checked is how many concrete requests the bounded search evaluated
	// under both sets (0 when Proved).
	Checked int
	// Truncated is true when the request space hit the policy engine's MaxShiftChecks.
	Truncated bool
	// Counterexample is set when the new set allows a request the old one
	// denied (for the solver's, after the real authorizer confirmed it).
	Counterexample *Counterexample
	// Solver is the SMT proof's verdict ("unsat", "sat", "unknown"), or ""
	// when no solver ran (Proved by construction, or the bounded search).
	Solver string
	// Unproved says why the edit could not be proven non-widening without
	// a counterexample (a construct outside the provable subset, a solver
	// timeout or failure, an unconfirmed model); such an edit is treated
	// as widening.
	Unproved string
	// Abstracted lists unchanged policies outside the provable subset that
	// the proof treated as unknown Booleans (sound, but they may hide why).
	Abstracted []string
	// Elapsed is the time the check took.
	Elapsed time.Duration
}

// Widens reports whether the edit must be treated as widening: a
// counterexample was found, or non-widening could not be proven.
func (r *ShiftReport) Widens() bool { return r != nil && (r.Counterexample != nil || r.Unproved != "") }

// Summary is one line for the audit log.
func (r *ShiftReport) Summary() string {
	switch {
	case r == nil:
		return "no check"
	case r.Counterexample != nil:
		return "widening: " + r.Counterexample.String()
	case r.Unproved != "":
		return "not proven non-widening: " + r.Unproved
	case r.Proved && r.Solver == "":
		return "non-widening by construction (adds forbids / removes permits only)"
	case r.Proved:
		return "proven non-widening (solver: unsat" + abstractedNote(r.Abstracted) + ")"
	}
	return "no widening found"
}

func abstractedNote(a []string) string {
	if len(a) == 0 {
		return ""
	}
	return "; unchanged policies outside the provable subset treated as unknown: " + strings.Join(a, ", ")
}

// Counterexample is one concrete request the new policy set allows and the
// old one denied.
type Counterexample struct {
	Principal SessionAttrs
	Action    string // "use" or "grant"
	Class     Class
	Use       *UseRequest // for "use"
	Grant     string      // for "grant": the grant context, rendered
	Policies  []string    // the policies that allowed it under the new set
}

func (c *Counterexample) String() string {
	if c == nil {
		return "<none>"
	}
	p := c.Principal
	who := fmt.Sprintf("session %q (image=%q trust=%s risk=%s tls_inspection=%t headless=%t)", p.ID, p.Image, p.TrustTier, p.Risk, p.TLSInspection, p.Headless)
	what := c.Grant
	if c.Use != nil {
		u := c.Use
		what = fmt.Sprintf("op=%s", u.Op)
		if u.Domain != "" {
			what += " domain=" + u.Domain
		}
		if u.IP.IsValid() {
			what += " ip=" + u.IP.String()
		}
		if u.Port != 0 {
			what += fmt.Sprintf(" port=%d", u.Port)
		}
		if u.Path != "" {
			what += " path=" + u.Path
		}
		if u.Item != "" {
			what += " item=" + u.Item
		}
		if u.Mode != "" {
			what += " mode=" + u.Mode
		}
	}
	return fmt.Sprintf("%s may now %s %s [%s], which the previous policy set denied (allowed by %s)", who, c.Action, c.Class, what, strings.Join(c.Policies, ", "))
}

// SessionAttrs is what policies know about a session (the Session entity).
type SessionAttrs struct {
	ID            string
	Image         string
	TrustTier     string // low | normal | high
	Risk          string // normal | high
	Headless      bool
	TLSInspection bool
	Protected     []string // paths no write may touch
	PolicyStore   []string // the policy store: no write may touch it
}
