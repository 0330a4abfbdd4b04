// Package shiftproof decides, with an SMT solver, whether a new Cedar policy
// set permits a request the old one denies: the permissiveness-shift proof
// of the agent's policy gate (seeds/permissions.md: "statically analyzable,
// so we can prove a policy edit never widens authority").
//
// It encodes the Cedar subset the agent's schema and policies use (see
// agent/README.md §5 for the exact list) over Shinken's request space:
// CIDR keys as bit-vectors of the request address, port keys as bit-vectors
// of the port, domain and path keys as string constraints on the request's
// name and path, free string-set attributes as bounded witness slots, and
// asks z3 for a request that the new set allows and the old set denies.
//
//   - Unsat: proven, for every request of the space, that the new set is not
//     wider.
//   - Sat: the model is read back as a concrete Request. The caller must
//     check it with the real authorizer before showing it (the agent does).
//   - Unknown (timeout, solver failure): the caller treats the edit as wider.
//
// A changed policy outside the subset is refused (ErrUnsupported, naming the
// policy and the construct); an unchanged one (the same text in both sets) is
// abstracted as an unknown Boolean of the request, the same in both sets,
// which keeps unsat a proof (any real request gives it some value).
package shiftproof

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
)

// ErrUnsupported is returned when a policy that differs between the sets
// uses a construct outside the encoded subset.
var ErrUnsupported = errors.New("shiftproof: policy outside the provable Cedar subset")

// Options of a proof.
type Options struct {
	Timeout time.Duration // per solver query; 0: DefaultTimeout
	Domain  *Domain       // nil: ShinkenDomain
	// Grants: a "use" request may also be permitted by permits in neither
	// set, the same in both (the live grants' policies, which a use-time
	// decision evaluates beside the set): any use request counts as
	// permitted by some grant, so a forbid removed or narrowed widens
	// wherever it held. Sound for every set of live grants, now or later.
	Grants bool
}

// DefaultTimeout bounds one solver query (there are two per proof, run in
// parallel: one per action).
var DefaultTimeout = 10 * time.Second

// Result of a proof.
type Result struct {
	Verdict Verdict
	// Counterexample is set when Verdict is Sat: a request the new set
	// allows and the old one denies, as the solver claims it (unchecked).
	Counterexample *Request
	// Trivial is true when no solver was needed: the edit adds no permit
	// and removes no forbid.
	Trivial bool
	// Abstracted lists unchanged policies outside the subset that were
	// abstracted (id: construct).
	Abstracted []string
	// Reason says why the verdict is Unknown.
	Reason string
	// Elapsed is the wall time of the proof.
	Elapsed time.Duration
}

func policyKey(p *cedar.Policy) string { return string(p.MarshalCedar()) }

type entry struct {
	id  cedar.PolicyID
	ast *xast.Policy
	key string
}

func entries(m cedar.PolicyMap) []entry {
	out := make([]entry, 0, len(m))
	for id, p := range m {
		out = append(out, entry{id, (*xast.Policy)(p.AST()), policyKey(p)})
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(string(a.id), string(b.id)) })
	return out
}

// Prove decides whether neu permits some request that old denies.
func Prove(ctx context.Context, old, neu cedar.PolicyMap, opts Options) (*Result, error) {
	start := time.Now()
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	dom := ShinkenDomain
	if opts.Domain != nil {
		dom = *opts.Domain
	}
	oldE, newE := entries(old), entries(neu)
	oldKeys, newKeys := map[string]bool{}, map[string]bool{}
	for _, p := range oldE {
		oldKeys[p.key] = true
	}
	for _, p := range newE {
		newKeys[p.key] = true
	}
	// W = (addedP ∧ ¬newF ∧ (¬oldP ∨ removedF)) ∨ (commonP ∧ ¬newF ∧ removedF):
	// a common permit can only widen if a forbid went away.
	var addedP, commonP, oldP, newF, removedF []entry
	for _, p := range newE {
		switch {
		case p.ast.Effect == xast.EffectForbid:
			newF = append(newF, p)
		case oldKeys[p.key]:
			commonP = append(commonP, p)
		default:
			addedP = append(addedP, p)
		}
	}
	for _, p := range oldE {
		switch {
		case p.ast.Effect == xast.EffectPermit:
			oldP = append(oldP, p)
		case !newKeys[p.key]:
			removedF = append(removedF, p)
		}
	}
	if len(addedP) == 0 && len(removedF) == 0 {
		return &Result{Verdict: Unsat, Trivial: true, Elapsed: time.Since(start)}, nil
	}
	need := map[string]int{}
	seen := map[string]bool{}
	for _, l := range [][]entry{oldE, newE} {
		for _, p := range l {
			if !seen[p.key] {
				seen[p.key] = true
				slotNeed(p.ast, need)
			}
		}
	}

	res := &Result{}
	type answer struct {
		v    Verdict
		req  *Request
		err  error
		abst []string
	}
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i, action := range []string{"use", "grant"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var a answer
			for _, strict := range []bool{false, true} {
				e := &enc{action: action, strict: strict, dom: dom, slots: need, grants: opts.Grants && action == "use"}
				script, abst, err := e.build(addedP, commonP, oldP, newF, removedF, oldKeys, newKeys)
				if err != nil {
					answers[i] = answer{err: err}
					return
				}
				if script == "" {
					a = answer{v: Unsat, abst: abst}
					break
				}
				v, vals, err := runZ3(ctx, script, e.vars, opts.Timeout)
				a = answer{v: v, err: err, abst: abst}
				if err == nil && v == Sat {
					a.req, a.err = e.readRequest(vals)
				}
				if a.err != nil || v == Unsat || v == Sat && a.req.valid() {
					break // relaxed unsat is a proof; a valid model is a model
				}
			}
			answers[i] = a
		}()
	}
	wg.Wait()
	res.Verdict = Unsat
	var reasons []string
	for i, a := range answers {
		res.Abstracted = append(res.Abstracted, a.abst...)
		switch {
		case errors.Is(a.err, ErrUnsupported):
			res.Elapsed = time.Since(start)
			return res, a.err
		case a.err != nil:
			res.Verdict = Unknown
			reasons = append(reasons, a.err.Error())
		case a.v == Sat && res.Counterexample == nil:
			res.Verdict, res.Counterexample = Sat, a.req
		case a.v == Unknown && res.Verdict != Sat:
			res.Verdict = Unknown
			reasons = append(reasons, fmt.Sprintf("the solver answered unknown for %q requests (timeout %s)", []string{"use", "grant"}[i], opts.Timeout))
		}
	}
	if res.Verdict == Sat {
		reasons = nil
	}
	res.Reason = strings.Join(reasons, "; ")
	slices.Sort(res.Abstracted)
	res.Abstracted = slices.Compact(res.Abstracted)
	res.Elapsed = time.Since(start)
	return res, nil
}

// build writes the query of one environment.
func (e *enc) build(addedP, commonP, oldP, newF, removedF []entry, oldKeys, newKeys map[string]bool) (script string, abstracted []string, err error) {
	e.declareRequest()
	var defs []string
	names := map[string]string{} // policy key -> defined name
	var refused []string
	// Principal slicing: a widening needs an added permit or a removed
	// forbid to hold, so when each of those names one session, the request's
	// principal is one of them, and a policy scoped to another session is
	// false for every request that matters (1,000 per-session policies cost
	// nothing when one of them changes).
	only := principalIDs(append(slices.Clone(addedP), removedF...))
	if only != nil {
		var ids []string
		for id := range only {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		e.assert(oneOf("p_id", ids))
	}
	def := func(p entry) string {
		if n, ok := names[p.key]; ok {
			return n
		}
		if only != nil {
			if id, ok := principalID(p.ast); ok && !only[id] {
				return "false"
			}
		}
		n := fmt.Sprintf("pol_%d", len(names))
		body, why := e.safePolicy(p.ast)
		if why == "" && (body == "false" || body == "true") {
			names[p.key] = body
			return body
		}
		names[p.key] = n
		if why != "" {
			if oldKeys[p.key] && newKeys[p.key] {
				// the same policy in both sets: an unknown Boolean of the request
				e.decl(n, "Bool")
				abstracted = append(abstracted, fmt.Sprintf("%s: %s", p.id, why))
				return n
			}
			refused = append(refused, fmt.Sprintf("%s (%s): %s", p.id, where(p.ast), why))
			body = "false"
		}
		defs = append(defs, fmt.Sprintf("(define-fun %s () Bool %s)", n, body))
		return n
	}
	any := func(l []entry) string {
		var xs []string
		for _, p := range l {
			xs = append(xs, def(p))
		}
		return or(xs...)
	}
	added, common, oldAny, newForbid, removed := any(addedP), any(commonP), any(oldP), any(newF), any(removedF)
	if len(refused) > 0 {
		return "", nil, fmt.Errorf("%w: %s", ErrUnsupported, strings.Join(refused, "; "))
	}
	w := or(and(added, not(newForbid), or(not(oldAny), removed)), and(common, not(newForbid), removed))
	if e.grants {
		// Some live grant permits the request in both sets: the old set
		// denied it only by a forbid the new one no longer has.
		w = or(w, and(not(newForbid), removed))
	}
	if w == "false" {
		return "", abstracted, nil // folded away (e.g. no added permit applies to this action): unsat
	}
	var b strings.Builder
	for _, d := range e.decls {
		b.WriteString(d + "\n")
	}
	for _, a := range e.asrt {
		b.WriteString(a + "\n")
	}
	for _, d := range defs {
		b.WriteString(d + "\n")
	}
	b.WriteString("(assert " + w + ")\n")
	return b.String(), abstracted, nil
}

// principalID is the session a policy's principal scope names, if any.
func principalID(p *xast.Policy) (string, bool) {
	switch x := p.Principal.(type) {
	case xast.ScopeTypeEq:
		return string(x.Entity.ID), x.Entity.Type == typeSession
	case xast.ScopeTypeIn:
		return string(x.Entity.ID), x.Entity.Type == typeSession
	}
	return "", false
}

// principalIDs: the sessions named by the policies' scopes, or nil when
// one of them does not name exactly one session.
func principalIDs(ps []entry) map[string]bool {
	if len(ps) == 0 {
		return nil
	}
	out := map[string]bool{}
	for _, p := range ps {
		id, ok := principalID(p.ast)
		if !ok {
			return nil
		}
		out[id] = true
	}
	return out
}

func where(p *xast.Policy) string {
	if p.Position.Line > 0 {
		return fmt.Sprintf("%s:%d", p.Position.Filename, p.Position.Line)
	}
	return "no position"
}

// safePolicy encodes p, or says which construct is outside the subset.
func (e *enc) safePolicy(p *xast.Policy) (body, why string) {
	defer func() {
		if r := recover(); r != nil {
			u, ok := r.(unsupported)
			if !ok {
				panic(r)
			}
			body, why = "", u.what
		}
	}()
	return e.policy(p), ""
}
