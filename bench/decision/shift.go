package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	cedar "github.com/cedar-policy/cedar-go"

	"github.com/shinken-agent/shinken/agent"
)

// The permissiveness-shift proof on a policy change (agent.Engine.CheckShift:
// z3 decides "does the new set permit a request the old one denies"),
// against the shipped base set plus N generated per-session admin policies.
// Each round is one proof of a change that is not trivially safe (a permit
// is edited, so the solver runs); the rounds alternate a narrowing (unsat)
// and a widening (sat, counterexample confirmed by cedar-go), so both
// answers are timed. Printed: shift_proof_p99_ms (goal < 500).
var (
	shiftPolicies = flag.Int("shift-policies", 1000, "generated per-session admin policies in the set the proof compares")
	shiftRounds   = flag.Int("shift-n", 40, "proofs timed (0: skip)")
)

// perSessionPolicies writes n admin policies, one per session: a standing
// egress permit to the session's own /24 on 443, and (every fifth) a read
// of its data directory.
func perSessionPolicies(n int, edit func(i int) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if s, ok := edit(i); ok {
			b.WriteString(s)
			continue
		}
		fmt.Fprintf(&b, "@id(\"site.s%05d.egress\")\npermit (principal == Shinken::Session::%q, action == Shinken::Action::\"use\", resource == Shinken::Capability::\"net.egress\")\n"+
			"when { context.request.cidr_keys.contains(\"10.%d.%d.0/24\") && context.request.port_keys.contains(\"443/16\") };\n", i, sessionID(i), (i>>8)&255, i&255)
		if i%5 == 0 {
			fmt.Fprintf(&b, "@id(\"site.s%05d.data\")\npermit (principal == Shinken::Session::%q, action == Shinken::Action::\"use\", resource == Shinken::Capability::\"fs.scope\")\n"+
				"when { context.request.op == \"read\" && context.request.path_keys.contains(\"/data/s%05d\") };\n", i, sessionID(i), i)
		}
	}
	return b.String()
}

func policySet(dir, text string) cedar.PolicyMap {
	check(os.WriteFile(filepath.Join(dir, "site.cedar"), []byte(text), 0o644))
	e, err := agent.NewEngine(dir)
	check(err)
	pm, _ := e.Flatten() // no sessions: the base set (shipped + directory)
	return pm
}

func shiftBench() {
	if *shiftRounds <= 0 {
		return
	}
	dir, err := os.MkdirTemp("", "shinken-shift-bench")
	check(err)
	defer os.RemoveAll(dir)
	n := *shiftPolicies
	base := policySet(dir, perSessionPolicies(n, func(int) (string, bool) { return "", false }))
	target := n / 2
	narrow := policySet(dir, perSessionPolicies(n, func(i int) (string, bool) {
		if i != target {
			return "", false
		}
		return fmt.Sprintf("@id(\"site.s%05d.egress\")\npermit (principal == Shinken::Session::%q, action == Shinken::Action::\"use\", resource == Shinken::Capability::\"net.egress\")\n"+
			"when { context.request.cidr_keys.contains(\"10.%d.%d.0/25\") && context.request.port_keys.contains(\"443/16\") && context.request.op == \"connect\" };\n", i, sessionID(i), (i>>8)&255, i&255), true
	}))
	wide := policySet(dir, perSessionPolicies(n, func(i int) (string, bool) {
		if i != target {
			return "", false
		}
		return fmt.Sprintf("@id(\"site.s%05d.egress\")\npermit (principal == Shinken::Session::%q, action == Shinken::Action::\"use\", resource == Shinken::Capability::\"net.egress\")\n"+
			"when { context.request.cidr_keys.contains(\"10.%d.0.0/16\") && context.request.port_keys.contains(\"443/16\") };\n", i, sessionID(i), (i>>8)&255), true
	}))
	eng, err := agent.NewEngine("")
	check(err)
	var lat []time.Duration
	for r := 0; r < *shiftRounds; r++ {
		neu, widens := narrow, false
		if r%2 == 1 {
			neu, widens = wide, true
		}
		start := time.Now()
		rep := eng.CheckShift(base, neu)
		lat = append(lat, time.Since(start))
		if rep.Unproved != "" || rep.Widens() != widens || widens && rep.Counterexample == nil || !widens && !rep.Proved {
			fail("shift proof round %d: %+v (want widens=%v)", r, rep, widens)
		}
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	fmt.Printf("shift proof (z3 %s, %d policies in each set, %d proofs, half narrowing/unsat, half widening/sat): p50=%.1fms p99=%.1fms max=%.1fms\n",
		z3Version(), len(base), len(lat), ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), ms(lat[len(lat)-1]))
	shiftP99 = ms(lat[len(lat)*99/100])
}

var shiftP99 float64

func z3Version() string {
	out, err := exec.Command("z3", "--version").Output()
	if err != nil {
		return "missing"
	}
	return strings.TrimSpace(strings.TrimPrefix(string(out), "Z3 version "))
}
