package shiftproof

import (
	"encoding/json"
	"fmt"
	pathpkg "path"
	"strings"

	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
)

// This file is the symbolic evaluator: a Cedar expression of the subset
// becomes an SMT term and the SMT condition under which evaluating it
// errors (Cedar skips a policy whose condition errors).

func cleanPath(p string) string { return pathpkg.Clean(p) }

type kind int

const (
	kAny kind = iota // a term that always errors
	kBool
	kLong
	kString
	kDatetime
	kEntity
	kSet
	kRecord
)

type setKind int

const (
	setLit     setKind = iota // a set expression: its elements are terms
	setFree                   // a free attribute: slots
	setDerived                // a key set derived from the request
)

type term struct {
	k   kind
	v   string           // bool, Int, String value; entity: its id (String)
	et  types.EntityType // entity type
	err string           // SMT Bool: evaluating the term errors
	lit bool             // v is a literal (for strings: smtString of litS)
	s   string           // literal string value
	// sets
	sk    setKind
	elems []term // setLit
	name  string // setFree: the attribute path; setDerived: path|domain|cidr|port
	// records and the principal: the record path
	rec string
}

var errTerm = term{k: kAny, v: "false", err: "true"}

// unsupported is the panic value for a construct outside the subset.
type unsupported struct{ what string }

func refuse(format string, args ...any) { panic(unsupported{fmt.Sprintf(format, args...)}) }

const (
	typeSession    = types.EntityType("Shinken::Session")
	typeCapability = types.EntityType("Shinken::Capability")
	typeAction     = types.EntityType("Shinken::Action")
)

// enc holds one query's declarations (one environment: action use or grant).
type enc struct {
	action string
	strict bool // assert the path and name grammars (see declareRequest)
	dom    Domain
	slots  map[string]int
	grants bool // a live grant may permit the request (Options.Grants, "use" only)
	decls  []string
	vars   []string
	asrt   []string
	fresh  int
}

func (e *enc) decl(name, sort string) {
	e.decls = append(e.decls, fmt.Sprintf("(declare-const %s %s)", name, sort))
	e.vars = append(e.vars, name)
}

func (e *enc) assert(xs ...string) {
	for _, x := range xs {
		if x != "true" {
			e.asrt = append(e.asrt, "(assert "+x+")")
		}
	}
}

// policy is the SMT condition "the policy is satisfied by the request"
// (scope matches, every when holds, every unless fails, nothing errors).
func (e *enc) policy(p *xast.Policy) string {
	parts := []string{e.principalScope(p.Principal), e.actionScope(p.Action), e.resourceScope(p.Resource)}
	for _, c := range p.Conditions {
		t := e.expr(c.Body)
		if t.k != kBool && t.k != kAny {
			return "false" // a non-boolean condition is a type error: never satisfied
		}
		if c.Condition == xast.ConditionWhen {
			parts = append(parts, not(t.err), t.v)
		} else {
			parts = append(parts, not(t.err), not(t.v))
		}
	}
	return and(parts...)
}

func (e *enc) entityIs(et types.EntityType, id types.String, varType types.EntityType, v string) string {
	if et != varType {
		return "false"
	}
	if varType == typeAction {
		return eq(v, smtString(string(id)))
	}
	return eq(v, smtString(string(id)))
}

func (e *enc) scope(s any, varType types.EntityType, v string) string {
	switch x := s.(type) {
	case xast.ScopeTypeAll:
		return "true"
	case xast.ScopeTypeEq:
		return e.entityIs(x.Entity.Type, x.Entity.ID, varType, v)
	case xast.ScopeTypeIn: // the schema declares no entity parents: "in" is "=="
		return e.entityIs(x.Entity.Type, x.Entity.ID, varType, v)
	case xast.ScopeTypeInSet:
		var xs []string
		for _, u := range x.Entities {
			xs = append(xs, e.entityIs(u.Type, u.ID, varType, v))
		}
		return or(xs...)
	case xast.ScopeTypeIs:
		if x.Type == varType {
			return "true"
		}
		return "false"
	case xast.ScopeTypeIsIn:
		if x.Type != varType {
			return "false"
		}
		return e.entityIs(x.Entity.Type, x.Entity.ID, varType, v)
	}
	refuse("scope %T", s)
	return ""
}

func (e *enc) principalScope(s xast.IsPrincipalScopeNode) string {
	return e.scope(s, typeSession, "p_id")
}
func (e *enc) resourceScope(s xast.IsResourceScopeNode) string {
	return e.scope(s, typeCapability, "r_class")
}
func (e *enc) actionScope(s xast.IsActionScopeNode) string {
	return e.scope(s, typeAction, smtString(e.action))
}

func strLit(s string) term {
	for _, r := range s {
		if r > 0x2ffff {
			refuse("string literal with character %U (beyond the solver's alphabet)", r)
		}
	}
	return term{k: kString, v: smtString(s), err: "false", lit: true, s: s}
}

func (e *enc) value(v types.Value) term {
	switch x := v.(type) {
	case types.String:
		return strLit(string(x))
	case types.Boolean:
		if x {
			return term{k: kBool, v: "true", err: "false", lit: true}
		}
		return term{k: kBool, v: "false", err: "false", lit: true}
	case types.Long:
		return term{k: kLong, v: smtInt(int64(x)), err: "false", lit: true}
	case types.Datetime:
		return term{k: kDatetime, v: smtInt(x.Milliseconds()), err: "false", lit: true}
	case types.EntityUID:
		t := strLit(string(x.ID))
		return term{k: kEntity, v: t.v, et: x.Type, err: "false", lit: true, s: string(x.ID)}
	case types.Set:
		out := term{k: kSet, sk: setLit, err: "false", lit: true}
		for el := range x.All() {
			out.elems = append(out.elems, e.value(el))
		}
		return out
	}
	refuse("value of type %T", v)
	return errTerm
}

func (e *enc) expr(n xast.IsNode) term {
	switch x := n.(type) {
	case xast.NodeValue:
		return e.value(x.Value)
	case xast.NodeTypeVariable:
		switch x.Name {
		case "principal":
			return term{k: kEntity, v: "p_id", et: typeSession, err: "false", rec: "principal"}
		case "resource":
			return term{k: kEntity, v: "r_class", et: typeCapability, err: "false"}
		case "action":
			t := strLit(e.action)
			return term{k: kEntity, v: t.v, et: typeAction, err: "false", lit: true, s: e.action}
		case "context":
			return term{k: kRecord, err: "false", rec: "context"}
		}
		refuse("variable %s", x.Name)
	case xast.NodeTypeAccess:
		return e.access(e.expr(x.Arg), string(x.Value))
	case xast.NodeTypeHas:
		b := e.expr(x.Arg)
		if b.err == "true" {
			return errTerm
		}
		if b.k == kEntity && b.rec == "" && b.et != typeCapability && b.et != typeAction {
			refuse("has on an entity other than principal, resource or action")
		}
		if b.k != kEntity && b.k != kRecord {
			return errTerm
		}
		_, ok := attributes(e.action, b.rec)[string(x.Value)]
		return term{k: kBool, v: fmt.Sprint(ok), err: b.err}
	case xast.NodeTypeNot:
		a := e.expr(x.Arg)
		if a.k != kBool {
			return errTerm
		}
		return term{k: kBool, v: not(a.v), err: a.err}
	case xast.NodeTypeAnd:
		a, b := e.expr(x.Left), e.expr(x.Right)
		if a.k != kBool {
			return errTerm
		}
		if b.k != kBool {
			b = errTerm
		}
		return term{k: kBool, v: and(a.v, b.v), err: or(a.err, and(a.v, b.err))}
	case xast.NodeTypeOr:
		a, b := e.expr(x.Left), e.expr(x.Right)
		if a.k != kBool {
			return errTerm
		}
		if b.k != kBool {
			b = errTerm
		}
		return term{k: kBool, v: or(a.v, b.v), err: or(a.err, and(not(a.v), b.err))}
	case xast.NodeTypeIfThenElse:
		c, a, b := e.expr(x.If), e.expr(x.Then), e.expr(x.Else)
		if c.k != kBool {
			return errTerm
		}
		if a.k == kSet || a.k == kEntity || a.k == kRecord || b.k == kSet || b.k == kEntity || b.k == kRecord {
			refuse("if-then-else yielding a set, entity or record")
		}
		k := a.k
		switch {
		case a.k == kAny:
			k = b.k
		case b.k != kAny && a.k != b.k:
			refuse("if-then-else with branches of different types")
		}
		return term{k: k, v: ite(c.v, a.v, b.v), err: or(c.err, and(c.v, a.err), and(not(c.v), b.err))}
	case xast.NodeTypeEquals:
		return e.equals(e.expr(x.Left), e.expr(x.Right))
	case xast.NodeTypeNotEquals:
		t := e.equals(e.expr(x.Left), e.expr(x.Right))
		t.v = not(t.v)
		return t
	case xast.NodeTypeLessThan:
		return e.compare("<", x.Left, x.Right)
	case xast.NodeTypeLessThanOrEqual:
		return e.compare("<=", x.Left, x.Right)
	case xast.NodeTypeGreaterThan:
		return e.compare(">", x.Left, x.Right)
	case xast.NodeTypeGreaterThanOrEqual:
		return e.compare(">=", x.Left, x.Right)
	case xast.NodeTypeIn:
		return e.in(e.expr(x.Left), e.expr(x.Right))
	case xast.NodeTypeIs:
		a := e.expr(x.Left)
		if a.k != kEntity {
			return errTerm
		}
		return term{k: kBool, v: fmt.Sprint(a.et == x.EntityType), err: a.err}
	case xast.NodeTypeIsIn:
		a := e.expr(x.Left)
		if a.k != kEntity {
			return errTerm
		}
		t := e.in(a, e.expr(x.Entity))
		t.v = and(fmt.Sprint(a.et == x.EntityType), t.v)
		return t
	case xast.NodeTypeLike:
		a := e.expr(x.Arg)
		if a.k != kString {
			return errTerm
		}
		return term{k: kBool, v: "(str.in_re " + a.v + " " + likeRegex(x.Value) + ")", err: a.err}
	case xast.NodeTypeContains:
		return e.contains(e.expr(x.Left), e.expr(x.Right))
	case xast.NodeTypeContainsAny:
		return e.containsAny(e.expr(x.Left), e.expr(x.Right))
	case xast.NodeTypeContainsAll:
		return e.containsAll(e.expr(x.Left), e.expr(x.Right))
	case xast.NodeTypeIsEmpty:
		return e.isEmpty(e.expr(x.Arg))
	case xast.NodeTypeSet:
		out := term{k: kSet, sk: setLit, err: "false", lit: true}
		var errs []string
		for _, el := range x.Elements {
			t := e.expr(el)
			if t.k == kSet || t.k == kRecord {
				refuse("a set of sets or records")
			}
			out.lit = out.lit && t.lit
			errs = append(errs, t.err)
			out.elems = append(out.elems, t)
		}
		out.err = or(errs...)
		return out
	case xast.NodeTypeExtensionCall:
		if x.Name == "datetime" && len(x.Args) == 1 {
			if v, ok := x.Args[0].(xast.NodeValue); ok {
				if s, ok := v.Value.(types.String); ok {
					d, err := types.ParseDatetime(string(s))
					if err != nil {
						return errTerm
					}
					return term{k: kDatetime, v: smtInt(d.Milliseconds()), err: "false", lit: true}
				}
			}
		}
		refuse("extension function %s", x.Name)
	case xast.NodeTypeNegate:
		if v, ok := x.Arg.(xast.NodeValue); ok {
			if l, ok := v.Value.(types.Long); ok && l != -l {
				return term{k: kLong, v: smtInt(-int64(l)), err: "false", lit: true}
			}
		}
		refuse("arithmetic (negation)")
	case xast.NodeTypeAdd, xast.NodeTypeSub, xast.NodeTypeMult:
		refuse("arithmetic (%T)", n)
	case xast.NodeTypeRecord:
		refuse("record literal")
	case xast.NodeTypeGetTag, xast.NodeTypeHasTag:
		refuse("entity tags")
	}
	refuse("expression %T", n)
	return errTerm
}

func (e *enc) access(b term, attr string) term {
	if b.err == "true" {
		return errTerm
	}
	switch {
	case b.k == kEntity && b.rec == "principal", b.k == kRecord:
	case b.k == kEntity && (b.et == typeCapability || b.et == typeAction || b.et == typeSession && b.lit):
		if b.lit && b.et == typeSession {
			refuse("attribute of an entity literal (%s::%q)", b.et, b.s)
		}
		return errTerm // no such attribute
	case b.k == kEntity:
		refuse("attribute of an entity literal (%s::%q)", b.et, b.s)
	default:
		return errTerm
	}
	a, ok := attributes(e.action, b.rec)[attr]
	if !ok {
		return errTerm
	}
	switch a.k {
	case kRecord:
		return term{k: kRecord, err: b.err, rec: a.name}
	case kSet:
		if _, free := freeSets[a.name]; free {
			return term{k: kSet, sk: setFree, name: a.name, err: b.err}
		}
		return term{k: kSet, sk: setDerived, name: a.name, err: b.err}
	}
	return term{k: a.k, v: a.name, err: b.err}
}

// eqTerms: a == b for two non-set, non-record terms (different types are
// never equal).
func eqTerms(a, b term) string {
	if a.k != b.k {
		return "false"
	}
	if a.k == kEntity && a.et != b.et {
		return "false"
	}
	return eq(a.v, b.v)
}

func (e *enc) equals(a, b term) term {
	if a.err == "true" || b.err == "true" {
		return errTerm
	}
	err := or(a.err, b.err)
	if a.k == kRecord || b.k == kRecord {
		refuse("record equality")
	}
	if a.k == kSet || b.k == kSet {
		if a.k != b.k {
			return term{k: kBool, v: "false", err: err}
		}
		if a.sk == setLit && b.sk == setLit && a.lit && b.lit {
			return term{k: kBool, v: and(e.containsAll(a, b).v, e.containsAll(b, a).v), err: err}
		}
		refuse("set equality")
	}
	return term{k: kBool, v: eqTerms(a, b), err: err}
}

func (e *enc) compare(op string, l, r xast.IsNode) term {
	a, b := e.expr(l), e.expr(r)
	if a.err == "true" || b.err == "true" || a.k != b.k || a.k != kLong && a.k != kDatetime {
		return errTerm
	}
	return term{k: kBool, v: "(" + op + " " + a.v + " " + b.v + ")", err: or(a.err, b.err)}
}

// in: the schema declares no entity parents (Session, Capability, Grant and
// the actions are all roots), so "A in B" is A == B, and "A in [..]" is A
// equal to one of them.
func (e *enc) in(a, b term) term {
	if a.err == "true" || b.err == "true" || a.k != kEntity {
		return errTerm
	}
	err := or(a.err, b.err)
	switch {
	case b.k == kEntity:
		return term{k: kBool, v: eqTerms(a, b), err: err}
	case b.k == kSet && b.sk == setLit:
		var xs []string
		for _, el := range b.elems {
			if el.k != kEntity {
				return errTerm
			}
			xs = append(xs, eqTerms(a, el))
		}
		return term{k: kBool, v: or(xs...), err: err}
	}
	return errTerm
}

// likeRegex: a Cedar pattern as an SMT regular expression.
func likeRegex(p types.Pattern) string {
	raw, _ := p.MarshalJSON()
	var comps []any
	_ = json.Unmarshal(raw, &comps)
	parts := []string{}
	for _, c := range comps {
		switch v := c.(type) {
		case string: // "Wildcard"
			parts = append(parts, "(re.* re.allchar)")
		case map[string]any:
			s, _ := v["Literal"].(string)
			parts = append(parts, "(str.to_re "+strLit(s).v+")")
		}
	}
	switch len(parts) {
	case 0:
		return `(str.to_re "")`
	case 1:
		return parts[0]
	}
	return "(re.++ " + strings.Join(parts, " ") + ")"
}
