package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"

	"github.com/shinken-agent/shinken/agent/shiftproof"
	"github.com/shinken-agent/shinken/agent/shiftproof/z3test"
)

// needZ3: see z3test.Require (a failure under CI, a skip elsewhere).
func needZ3(t testing.TB) {
	t.Helper()
	z3test.Require(t, shiftproof.Z3Path)
}

// withPolicies is the shipped base set plus the given admin policies.
func withPolicies(t testing.TB, e *Engine, src string) cedar.PolicyMap {
	t.Helper()
	m := maps2(e.base.Load().policies)
	if src == "" {
		return m
	}
	list, err := cedar.NewPolicyListFromBytes("gen.cedar", []byte(src))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, src)
	}
	for i, p := range list {
		id := cedar.PolicyID(fmt.Sprintf("gen#%d", i))
		if v, ok := p.Annotations()["id"]; ok {
			id = cedar.PolicyID(v)
		}
		if err := e.validator.Policy(string(id), (*xast.Policy)(p.AST())); err != nil {
			t.Fatalf("generated policy does not validate: %v\n%s", err, src)
		}
		m[id] = p
	}
	return m
}

// TestShiftProofKnownPairs: the solver proves a known narrowing unsat and
// finds the known widening's counterexample, which the real authorizer
// permits under the new set and denies under the old one.
func TestShiftProofKnownPairs(t *testing.T) {
	needZ3(t)
	e := newTestEngine(t, "")
	wide := `@id("admin.egress") permit (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress")
when { context.request.cidr_keys.contains("10.0.0.0/8") && context.request.port_keys.contains("443/16") };`
	narrow := strings.Replace(wide, "10.0.0.0/8", "10.1.0.0/16", 1)
	old, neu := withPolicies(t, e, wide), withPolicies(t, e, narrow)

	rep := e.CheckShift(old, neu)
	if !rep.Proved || rep.Solver != "unsat" || rep.Widens() {
		t.Fatalf("narrowing: %+v, want proven (unsat)", rep)
	}
	rep = e.CheckShift(neu, old)
	if rep.Solver != "sat" || rep.Counterexample == nil || rep.Counterexample.Use == nil {
		t.Fatalf("widening: %+v, want a counterexample", rep)
	}
	ce := rep.Counterexample
	t.Logf("counterexample: %s", ce)
	ip := ce.Use.IP
	if !ip.Is4() || ip.As4()[0] != 10 || ip.As4()[1] == 1 || ce.Use.Port != 443 || ce.Principal.ID != "s1" {
		t.Fatalf("counterexample %s is not in 10/8 minus 10.1/16 on port 443 for s1", ce)
	}
	// checked, not trusted: evaluate it again here with the real authorizer
	ents := types.EntityMap{sessionUID(ce.Principal.ID): sessionEntity(ce.Principal)}
	testNow := time.Now()
	for _, c := range []struct {
		set  cedar.PolicyMap
		want cedar.Decision
	}{{old, cedar.Allow}, {neu, cedar.Deny}} {
		d, _ := cedar.Authorize(c.set, ents, cedar.Request{Principal: sessionUID(ce.Principal.ID), Action: actionUse, Resource: capabilityUID(ce.Class), Context: useContext(*ce.Use, testNow)})
		if d != c.want {
			t.Fatalf("authorizer says %v, want %v", d, c.want)
		}
	}
	// an unconfirmed model is never shown as a counterexample
	if _, err := confirm(neu, old, &shiftproof.Request{Action: "use", Class: "net.egress", Op: "connect", Session: shiftproof.Session{ID: "s2"}}); !errors.Is(err, errUnconfirmed) {
		t.Fatalf("confirm of a bogus model: %v", err)
	}
}

// TestShiftProofRefusesOutsideSubset: a changed policy with a construct the
// encoding does not cover is refused (treated as widening) with its id and
// the construct, never ignored.
func TestShiftProofRefusesOutsideSubset(t *testing.T) {
	needZ3(t)
	dir := t.TempDir()
	e := newTestEngine(t, dir)
	writeFile(t, filepath.Join(dir, "x.cedar"), `@id("admin.arith") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu") unless { 1 + 1 == 2 };`)
	// adding a forbid only: non-widening by construction, whatever it says
	if rep, err := e.Reload(ReloadOptions{}); err != nil || !rep.Proved {
		t.Fatalf("adding a forbid: %+v, %v", rep, err)
	}
	writeFile(t, filepath.Join(dir, "x.cedar"), `@id("admin.arith") permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu") when { 1 + 1 == 3 };`)
	rep, err := e.Reload(ReloadOptions{})
	if !errors.Is(err, ErrPolicyWidens) || !strings.Contains(err.Error(), "admin.arith") || !strings.Contains(err.Error(), "arithmetic") || rep.Counterexample != nil {
		t.Fatalf("Reload = %+v, %v; want a refusal naming admin.arith and arithmetic", rep, err)
	}
}

// The generated corpus: random admin policies over the subset, and a
// random edit of them.
type policyGen struct{ r *rand.Rand }

func (g policyGen) pick(xs ...string) string { return xs[g.r.IntN(len(xs))] }

func (g policyGen) atom(class, action string) string {
	if action == "grant" {
		return g.pick(`context.tier == "ask"`, `context.tier == "auto"`, `context.lifecycle == "once"`, `context.scope.tls_inspect`,
			`context.scope.flags.contains("copy_out")`, `context.scope.write_keys.contains("/work")`, `principal.trust_tier == "high"`,
			`principal.image == "py"`, `context.provenance == "external"`)
	}
	if g.r.IntN(4) == 0 {
		return g.pick(`principal.image == "py"`, `principal.image == "trainer"`, `principal.image like "p*"`, `principal.trust_tier == "low"`,
			`principal.risk == "high"`, `principal.headless`, `principal.tls_inspection`, `principal.protected.contains("/home/agent/.ssh")`)
	}
	switch class {
	case "net.egress":
		switch g.r.IntN(3) {
		case 0:
			return fmt.Sprintf(`context.request.cidr_keys.contains(%q)`, g.pick("10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "192.168.0.0/16", "0.0.0.0/0", "2001:db8::/32", "2001:db8:1::/48", "203.0.113.7/32"))
		case 1:
			return fmt.Sprintf(`context.request.port_keys.contains(%q)`, g.pick("443/16", "80/16", "0/0", "8000/13", "0/6", "8080/16"))
		}
		return fmt.Sprintf(`context.request.domain_keys.contains(%q)`, g.pick("**.example.com", "*.example.com", "example.com", "api.example.com", "**.evil.test", "x.api.example.com"))
	case "fs.scope":
		if g.r.IntN(3) == 0 {
			return g.pick(`context.request.op == "read"`, `context.request.op == "write"`)
		}
		return fmt.Sprintf(`context.request.path_keys.contains(%q)`, g.pick("/work", "/work/out", "/data", "/", "/home/agent/.ssh", "/work/out/x"))
	}
	return g.pick(`context.request.mode == "compute"`, `context.request.mode == "render"`, `context.request.item == "0"`, `context.request.item == "1"`, `context.request.op == "use"`)
}

type genPolicy struct {
	permit        bool
	principal     string
	class, action string
	atoms         []string
	neg           []bool
}

func (g policyGen) policy() genPolicy {
	p := genPolicy{permit: g.r.IntN(5) != 0, principal: g.pick("", "", `== Shinken::Session::"s1"`, `== Shinken::Session::"s2"`),
		class: g.pick("net.egress", "net.egress", "fs.scope", "gpu"), action: "use"}
	if g.r.IntN(6) == 0 {
		p.action = "grant"
	}
	for n := 1 + g.r.IntN(3); n > 0; n-- {
		p.atoms = append(p.atoms, g.atom(p.class, p.action))
		p.neg = append(p.neg, g.r.IntN(6) == 0)
	}
	return p
}

func (p genPolicy) text(id int) string {
	eff := "forbid"
	if p.permit {
		eff = "permit"
	}
	var conds []string
	for i, a := range p.atoms {
		if p.neg[i] {
			a = "!(" + a + ")"
		}
		conds = append(conds, a)
	}
	return fmt.Sprintf("@id(\"gen.%d\") %s (principal %s, action == Shinken::Action::%q, resource == Shinken::Capability::%q) when { %s };\n",
		id, eff, p.principal, p.action, p.class, strings.Join(conds, " && "))
}

func (g policyGen) edit(ps []genPolicy) []genPolicy {
	out := make([]genPolicy, len(ps))
	for i, p := range ps {
		out[i] = p
		out[i].atoms = append([]string(nil), p.atoms...)
		out[i].neg = append([]bool(nil), p.neg...)
	}
	i := g.r.IntN(len(out))
	p := &out[i]
	switch g.r.IntN(6) {
	case 0: // drop a condition
		if len(p.atoms) > 1 {
			k := g.r.IntN(len(p.atoms))
			p.atoms, p.neg = append(p.atoms[:k], p.atoms[k+1:]...), append(p.neg[:k], p.neg[k+1:]...)
		}
	case 1: // add a condition
		p.atoms, p.neg = append(p.atoms, g.atom(p.class, p.action)), append(p.neg, false)
	case 2: // change a literal
		p.atoms[g.r.IntN(len(p.atoms))] = g.atom(p.class, p.action)
	case 3: // a new policy
		out = append(out, g.policy())
	case 4: // remove one
		out = append(out[:i], out[i+1:]...)
	case 5: // flip the effect or the principal
		if g.r.IntN(2) == 0 {
			p.permit = !p.permit
		} else {
			p.principal = g.pick("", `== Shinken::Session::"s1"`)
		}
	}
	return out
}

func texts(ps []genPolicy) string {
	var b strings.Builder
	for i, p := range ps {
		b.WriteString(p.text(i))
	}
	return b.String()
}

// TestShiftProofAgreesWithSearch: on 240 generated policy edits, whenever
// the bounded search finds a counterexample the solver finds one too (and
// it is confirmed), and the solver never proves an edit the search shows
// widening. The solver may find widenings the search misses; those are
// counted.
func TestShiftProofAgreesWithSearch(t *testing.T) {
	needZ3(t)
	e := newTestEngine(t, "")
	defer func(n int) { MaxShiftChecks = n }(MaxShiftChecks)
	MaxShiftChecks = 10_000
	g := policyGen{rand.New(rand.NewPCG(13, 2026))}
	var both, solverOnly, neither, unsat int
	var searchTime, proofTime time.Duration
	for n := 0; n < 240; n++ {
		var ps []genPolicy
		for k := 1 + g.r.IntN(3); k > 0; k-- {
			ps = append(ps, g.policy())
		}
		oldSrc, newSrc := texts(ps), texts(g.edit(ps))
		old, neu := withPolicies(t, e, oldSrc), withPolicies(t, e, newSrc)
		t0 := time.Now()
		search := e.SearchShift(old, neu)
		searchTime += time.Since(t0)
		proof := e.CheckShift(old, neu)
		proofTime += proof.Elapsed
		if proof.Unproved != "" {
			t.Fatalf("pair %d: not decided: %s\nold:\n%s\nnew:\n%s", n, proof.Unproved, oldSrc, newSrc)
		}
		switch {
		case search.Counterexample != nil && proof.Counterexample == nil:
			t.Fatalf("pair %d: the search found %s but the solver says %s\nold:\n%s\nnew:\n%s", n, search.Counterexample, proof.Solver, oldSrc, newSrc)
		case search.Counterexample != nil:
			both++
		case proof.Counterexample != nil:
			solverOnly++
		default:
			neither++
		}
		if proof.Proved {
			unsat++
		}
	}
	t.Logf("240 pairs: both found a widening %d, only the solver %d, neither %d (proven non-widening: %d); search %s, proof %s",
		both, solverOnly, neither, unsat, searchTime.Round(time.Millisecond), proofTime.Round(time.Millisecond))
	if both < 15 || neither < 40 {
		t.Fatalf("the corpus is lopsided (both %d, neither %d): it does not exercise both answers", both, neither)
	}
}

// TestShiftProofManyPolicies: a one-policy edit among 1,000 per-session
// admin policies is proven (narrowing) or refuted with a confirmed
// counterexample (widening), as bench/decision times it.
func TestShiftProofManyPolicies(t *testing.T) {
	needZ3(t)
	e := newTestEngine(t, "")
	gen := func(target int, cond string) string {
		var b strings.Builder
		for i := 0; i < 1000; i++ {
			c := fmt.Sprintf(`context.request.cidr_keys.contains("10.%d.%d.0/24") && context.request.port_keys.contains("443/16")`, i>>8, i&255)
			if i == target {
				c = cond
			}
			fmt.Fprintf(&b, "@id(\"site.%d\") permit (principal == Shinken::Session::\"s%05d\", action == Shinken::Action::\"use\", resource == Shinken::Capability::\"net.egress\") when { %s };\n", i, i, c)
		}
		return b.String()
	}
	old := withPolicies(t, e, gen(-1, ""))
	narrow := withPolicies(t, e, gen(500, `context.request.cidr_keys.contains("10.1.244.0/25") && context.request.port_keys.contains("443/16")`))
	wide := withPolicies(t, e, gen(500, `context.request.cidr_keys.contains("10.1.0.0/16") && context.request.port_keys.contains("443/16")`))
	if rep := e.CheckShift(old, narrow); !rep.Proved || rep.Solver != "unsat" {
		t.Fatalf("narrowing among 1,000: %+v", rep)
	} else {
		t.Logf("narrowing proven in %s", rep.Elapsed)
	}
	rep := e.CheckShift(old, wide)
	if rep.Counterexample == nil || rep.Counterexample.Principal.ID != "s00500" {
		t.Fatalf("widening among 1,000: %+v", rep)
	}
	t.Logf("widening found in %s: %s", rep.Elapsed, rep.Counterexample)
}
