package policy

// Decision layer: the forbids the kernel enforces. An admin or hard-deny
// forbid whose condition, for a net.egress use request, depends only on the
// destination (its address and port) compiles into the deny table
// (backend.DenyEntry): the kernel then refuses what it names before any
// grant, as the never-list is. Every other forbid that can apply to a
// net.egress use is reported as enforced at decide time only, with why.
//
// The compilation is exact for what it accepts: the deny table refuses an
// address and port exactly when the forbid applies to a net.egress use
// request for them, with the request keys Decide builds (every literal the
// base set names is a key length Decide always builds, so a literal key
// matches exactly the addresses it covers). It accepts:
//   - scopes: principal unconstrained (or `is Session`); action
//     unconstrained, `== use`, `in use`, `in [.., use, ..]`; resource
//     unconstrained, `is Capability`, `== / in Capability::"net.egress"`;
//   - conditions made of `&&`, `||`, `!` of a constant, Boolean literals,
//     `context.request.op == "..."` (net.egress's one op is "connect"),
//     and `context.request.cidr_keys` / `port_keys` `.contains(literal)` or
//     `.containsAny([literals])`; `unless` of a constant.
// A forbid whose scope rules out net.egress use requests (another action,
// another class, a principal that is no Session), or whose condition is
// false for every such request, is not reported: it never applies there.

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// KernelForbids is what the kernel enforces of a policy set's forbids.
type KernelForbids struct {
	// Entries is the deny table, in the order of the forbids (sorted by id).
	Entries []backend.DenyEntry
	// Kernel lists the forbids compiled into Entries (policy ids).
	Kernel []string
	// DecideOnly lists the forbids that can apply to a net.egress use and
	// that the kernel does not enforce: Decide and the resolver do.
	DecideOnly []capability.DecideOnlyForbid
}

// Report is the summary callers show (policy diff, status).
func (k KernelForbids) Report() *capability.ForbidReport {
	return &capability.ForbidReport{InKernel: slices.Clone(k.Kernel), DecideTimeOnly: slices.Clone(k.DecideOnly)}
}

// KernelForbids compiles the forbids of the set in force.
func (e *Engine) KernelForbids() KernelForbids { return compileForbids(e.base.Load()) }

// KernelForbids compiles the set's forbids.
func (s *Set) KernelForbids() KernelForbids { return compileForbids(s.b) }

func compileForbids(b *policyBase) KernelForbids {
	ids := make([]cedar.PolicyID, 0, len(b.policies))
	for id, p := range b.policies {
		if p.AST().Effect == xast.EffectForbid {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var out KernelForbids
	for _, id := range ids {
		entries, applies, why := forbidEntries((*xast.Policy)(b.policies[id].AST()))
		if !applies {
			continue
		}
		if why == "" {
			// The kernel's own bounds: ranges per entry, entries per family.
			if _, err := backend.DenyTable(append(slices.Clone(out.Entries), entries...)); err != nil {
				why = "the kernel's deny table cannot hold it: " + err.Error()
			}
		}
		if why != "" {
			out.DecideOnly = append(out.DecideOnly, capability.DecideOnlyForbid{ID: string(id), Where: b.where[id], Why: why})
			continue
		}
		out.Entries = append(out.Entries, entries...)
		out.Kernel = append(out.Kernel, string(id))
	}
	return out
}

// forbidEntries compiles one forbid: applies says whether it can apply to
// some net.egress use request at all; why, when not empty, why the kernel
// cannot enforce it.
func forbidEntries(p *xast.Policy) (entries []backend.DenyEntry, applies bool, why string) {
	if !scopeAllowsEgressUse(p) {
		return nil, false, ""
	}
	switch s := p.Principal.(type) {
	case xast.ScopeTypeAll:
	case xast.ScopeTypeIs:
		if s.Type != typeSession {
			return nil, false, ""
		}
	case xast.ScopeTypeEq, xast.ScopeTypeIn, xast.ScopeTypeIsIn:
		// A per-session forbid: the deny table is the host's.
		why = "its scope names one session (the deny table is the host's)"
	default:
		why = "its principal scope"
	}
	d := allDests()
	for _, c := range p.Conditions {
		v, ok, w := destsOf(c.Body)
		if c.Condition == xast.ConditionUnless {
			if ok && !v.isConst() {
				ok, w = false, "an unless clause on the destination"
			}
			if ok {
				v = v.not()
			}
		}
		if !ok {
			if why == "" {
				why = "its condition " + w
			}
			continue
		}
		d = d.and(v)
	}
	if len(d) == 0 {
		return nil, false, "" // false for every net.egress use
	}
	if why != "" {
		return nil, true, why
	}
	for _, bx := range d {
		entries = append(entries, backend.DenyEntry{Prefix: bx.p, Lo: bx.lo, Hi: bx.hi})
	}
	return entries, true, ""
}

// scopeAllowsEgressUse: the action and resource scopes admit a use of
// net.egress.
func scopeAllowsEgressUse(p *xast.Policy) bool {
	switch a := p.Action.(type) {
	case xast.ScopeTypeAll:
	case xast.ScopeTypeEq:
		if a.Entity != actionUse {
			return false
		}
	case xast.ScopeTypeIn:
		if a.Entity != actionUse {
			return false
		}
	case xast.ScopeTypeInSet:
		if !slices.Contains(a.Entities, actionUse) {
			return false
		}
	default:
		return false
	}
	egress := types.NewEntityUID(typeCapability, types.String(capability.ClassNetEgress))
	switch r := p.Resource.(type) {
	case xast.ScopeTypeAll:
	case xast.ScopeTypeEq:
		return r.Entity == egress
	case xast.ScopeTypeIn:
		return r.Entity == egress
	case xast.ScopeTypeIs:
		return r.Type == typeCapability
	case xast.ScopeTypeIsIn:
		return r.Type == typeCapability && r.Entity == egress
	default:
		return false
	}
	return true
}

// box is the destinations with an address in p and a port in lo..hi.
type box struct {
	p      netip.Prefix
	lo, hi uint16
}

// dests is a union of boxes (nil: none).
type dests []box

func allDests() dests {
	return dests{{netip.MustParsePrefix("0.0.0.0/0"), 0, 0xffff}, {netip.MustParsePrefix("::/0"), 0, 0xffff}}
}

func (d dests) isAll() bool { return len(d) == 2 && slices.Equal(d, allDests()) }

// isConst: every destination or none.
func (d dests) isConst() bool { return len(d) == 0 || d.isAll() }

// not is the complement of a constant.
func (d dests) not() dests {
	if len(d) == 0 {
		return allDests()
	}
	return nil
}

func (d dests) and(o dests) dests {
	var out dests
	for _, a := range d {
		for _, b := range o {
			if a.p.Addr().Is4() != b.p.Addr().Is4() || !a.p.Overlaps(b.p) {
				continue
			}
			lo, hi := max(a.lo, b.lo), min(a.hi, b.hi)
			if lo > hi {
				continue
			}
			p := a.p
			if b.p.Bits() > p.Bits() {
				p = b.p
			}
			out = append(out, box{p, lo, hi})
		}
	}
	return out
}

func (d dests) or(o dests) dests { return append(slices.Clone(d), o...) }

// destsOf reads a condition as the destinations of net.egress use requests
// it holds for; ok false (with why) when it depends on anything else.
func destsOf(n xast.IsNode) (d dests, ok bool, why string) {
	switch v := n.(type) {
	case xast.NodeValue:
		if b, isBool := v.Value.(types.Boolean); isBool {
			if b {
				return allDests(), true, ""
			}
			return nil, true, ""
		}
	case xast.NodeTypeAnd:
		l, ok, why := destsOf(v.Left)
		if ok && len(l) == 0 {
			return nil, true, "" // short-circuit: the right side is not evaluated
		}
		r, rok, rwhy := destsOf(v.Right)
		if rok && len(r) == 0 {
			return nil, true, "" // false whatever the left side (an error also skips the policy)
		}
		if !ok {
			return nil, false, why
		}
		if !rok {
			return nil, false, rwhy
		}
		return l.and(r), true, ""
	case xast.NodeTypeOr:
		l, ok, why := destsOf(v.Left)
		if !ok {
			return nil, false, why
		}
		if l.isAll() {
			return l, true, ""
		}
		r, ok, why := destsOf(v.Right)
		if !ok {
			return nil, false, why
		}
		return l.or(r), true, ""
	case xast.NodeTypeNot:
		a, ok, why := destsOf(v.Arg)
		if !ok {
			return nil, false, why
		}
		if !a.isConst() {
			return nil, false, "negates a destination test"
		}
		return a.not(), true, ""
	case xast.NodeTypeEquals:
		if s, ok := opLiteral(v.Left, v.Right); ok {
			if s == "connect" {
				return allDests(), true, ""
			}
			return nil, true, ""
		}
	case xast.NodeTypeContains:
		if key := requestKey(v.Left); key != "" {
			if s, ok := literalString(v.Right); ok {
				return keyDests(key, []string{s}), true, ""
			}
		}
	case xast.NodeTypeContainsAny:
		if key := requestKey(v.Left); key != "" {
			if ss, ok := literalStrings(v.Right); ok {
				return keyDests(key, ss), true, ""
			}
		}
	}
	return nil, false, "reads " + whatItReads(n)
}

// whatItReads names what a condition the kernel cannot hold depends on.
func whatItReads(n xast.IsNode) string {
	what := ""
	xast.Inspect(xast.NewNode(n), func(x xast.IsNode) bool {
		switch v := x.(type) {
		case xast.NodeTypeVariable:
			if v.Name == "principal" && what == "" {
				what = "the session's attributes (principal)"
			}
		case xast.NodeTypeAccess:
			switch v.Value {
			case "domain_keys":
				what = "the destination's name (domain_keys)"
			case "now":
				what = "the time (context.now)"
			}
		}
		return what == ""
	})
	if what == "" {
		what = "more than the destination's address and port (" + nodeName(n) + ")"
	}
	return what
}

// requestKey names context.request.cidr_keys or port_keys ("" otherwise).
func requestKey(n xast.IsNode) string {
	a, ok := n.(xast.NodeTypeAccess)
	if !ok || (a.Value != "cidr_keys" && a.Value != "port_keys") {
		return ""
	}
	r, ok := a.Arg.(xast.NodeTypeAccess)
	if !ok || r.Value != "request" {
		return ""
	}
	if c, ok := r.Arg.(xast.NodeTypeVariable); !ok || c.Name != "context" {
		return ""
	}
	return string(a.Value)
}

// opLiteral: one side is context.request.op, the other a string literal.
func opLiteral(l, r xast.IsNode) (string, bool) {
	isOp := func(n xast.IsNode) bool {
		a, ok := n.(xast.NodeTypeAccess)
		if !ok || a.Value != "op" {
			return false
		}
		q, ok := a.Arg.(xast.NodeTypeAccess)
		if !ok || q.Value != "request" {
			return false
		}
		c, ok := q.Arg.(xast.NodeTypeVariable)
		return ok && c.Name == "context"
	}
	if isOp(l) {
		return literalString(r)
	}
	if isOp(r) {
		return literalString(l)
	}
	return "", false
}

func literalString(n xast.IsNode) (string, bool) {
	v, ok := n.(xast.NodeValue)
	if !ok {
		return "", false
	}
	s, ok := v.Value.(types.String)
	return string(s), ok
}

func literalStrings(n xast.IsNode) ([]string, bool) {
	var out []string
	switch v := n.(type) {
	case xast.NodeTypeSet:
		for _, e := range v.Elements {
			s, ok := literalString(e)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	case xast.NodeValue:
		set, ok := v.Value.(types.Set)
		if !ok {
			return nil, false
		}
		for e := range set.All() {
			s, ok := e.(types.String)
			if !ok {
				return nil, false
			}
			out = append(out, string(s))
		}
		return out, true
	}
	return nil, false
}

// keyDests is the destinations whose request keys (cidr_keys or
// port_keys) hold one of lits. A literal no request key is ever spelled as
// (not canonical, IPv4-mapped) matches nothing.
func keyDests(key string, lits []string) dests {
	var out dests
	for _, s := range lits {
		if key == "cidr_keys" {
			p, err := netip.ParsePrefix(s)
			if err != nil || p.String() != s || p.Masked() != p || p.Addr().Is4In6() || p.Addr().Zone() != "" {
				continue
			}
			out = append(out, box{p, 0, 0xffff})
			continue
		}
		if lo, hi, ok := portBlock(s); ok {
			out = append(out, box{netip.MustParsePrefix("0.0.0.0/0"), lo, hi}, box{netip.MustParsePrefix("::/0"), lo, hi})
		}
	}
	return out
}

// portBlock reads a canonical aligned port block "base/len" (portKeysOf's
// spelling) as a range.
func portBlock(s string) (lo, hi uint16, ok bool) {
	b, l, found := strings.Cut(s, "/")
	if !found {
		return 0, 0, false
	}
	base, err1 := strconv.Atoi(b)
	n, err2 := strconv.Atoi(l)
	if err1 != nil || err2 != nil || n < 0 || n > 16 || base < 0 || base > 0xffff ||
		strconv.Itoa(base) != b || strconv.Itoa(n) != l {
		return 0, 0, false
	}
	size := 1 << (16 - n)
	if base%size != 0 {
		return 0, 0, false
	}
	return uint16(base), uint16(base + size - 1), true
}

func nodeName(n xast.IsNode) string {
	s := fmt.Sprintf("%T", n)
	s = strings.TrimPrefix(s, "ast.NodeType")
	return strings.TrimPrefix(s, "ast.")
}
