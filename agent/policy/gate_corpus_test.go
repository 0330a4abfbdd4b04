package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The bounded key space of the gate corpus: addresses and ports near the
// literals the policies and grants name.
var (
	corpusCIDRs  = []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "192.168.0.0/16", "0.0.0.0/0", "2001:db8::/32", "::/0"}
	corpusBlocks = []string{"443/16", "80/16", "0/6", "8000/13", "0/0"}
	corpusAddrs  = []string{"10.1.2.3", "10.1.2.9", "10.1.7.1", "10.9.0.1", "192.168.3.4", "11.0.0.1", "2001:db8::5", "2001:db9::5", "::ffff:10.1.2.3"}
	corpusPorts  = []uint16{443, 80, 22, 8003, 1023, 9000}
	corpusGrants = [][]string{{"0.0.0.0/0"}, {"10.0.0.0/8"}, {"10.1.2.0/24"}, {"::/0"}, {"192.168.0.0/16", "2001:db8::/32"}}
)

// corpusPolicy is a random admin permit or forbid over the key space,
// now and then one that reads the pruned keys (isEmpty) or the session.
func corpusPolicy(r *rand.Rand, id int) string {
	pick := func(pool []string) string { return strconv.Quote(pool[r.IntN(len(pool))]) }
	var cond func(depth int) string
	cond = func(depth int) string {
		k := r.IntN(10)
		if depth > 1 {
			k = r.IntN(5)
		}
		switch k {
		case 0, 1:
			return `context.request.cidr_keys.contains(` + pick(corpusCIDRs) + `)`
		case 2:
			return `context.request.port_keys.contains(` + pick(corpusBlocks) + `)`
		case 3:
			return `context.request.cidr_keys.containsAny([` + pick(corpusCIDRs) + `, ` + pick(corpusCIDRs) + `])`
		case 4:
			if r.IntN(4) == 0 {
				return `context.request.cidr_keys.isEmpty()`
			}
			return `principal.trust_tier == "normal"`
		case 5, 6:
			return "(" + cond(depth+1) + " && " + cond(depth+1) + ")"
		case 7:
			return "(" + cond(depth+1) + " || " + cond(depth+1) + ")"
		case 8:
			return "!(" + cond(depth+1) + ")"
		}
		return `context.request.op == "connect"`
	}
	effect := "forbid"
	if r.IntN(3) == 0 {
		effect = "permit"
	}
	principal := "principal"
	if r.IntN(3) == 0 {
		principal = `principal == Shinken::Session::"s1"`
	}
	return fmt.Sprintf(`@id("admin.c%d") %s (%s, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { %s };`, id, effect, principal, cond(0))
}

// corpusEdit is a random edit of ps: a policy removed, added or replaced.
func corpusEdit(r *rand.Rand, ps []string, next int) []string {
	out := append([]string(nil), ps...)
	switch k := r.IntN(3); {
	case k == 0 && len(out) > 0:
		i := r.IntN(len(out))
		out = append(out[:i], out[i+1:]...)
	case k == 1 && len(out) > 0:
		i := r.IntN(len(out))
		id := out[i][len(`@id("`):strings.Index(out[i], `")`)]
		p := corpusPolicy(r, next)
		out[i] = strings.Replace(p, fmt.Sprintf("admin.c%d", next), id, 1) // the same id, another text
	default:
		out = append(out, corpusPolicy(r, next))
	}
	return out
}

// corpusDecisions evaluates every request of the key space for sessions
// s1 and s2 holding grants, with the production engine over ps.
func corpusDecisions(t *testing.T, ps []string, grants [][]string) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "admin.cedar"), strings.Join(ps, "\n"))
	e := newTestEngine(t, dir)
	out := map[string]bool{}
	for i, sess := range []string{"s1", "s2"} {
		e.PutSession(testSession(sess))
		c := egress(grants[i], nil)
		if i == 1 {
			c.Egress.Ports = []PortRange{{Lo: 443, Hi: 443}}
		}
		if len(grants[i]) > 0 {
			if err := e.PutGrant(GrantData{ID: "g-" + sess, Session: sess, Capability: c}); err != nil {
				t.Fatal(err)
			}
		}
		for _, a := range corpusAddrs {
			for _, port := range corpusPorts {
				d, err := e.Decide(sess, UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr(a), Port: port}, t0)
				if err != nil {
					t.Fatal(err)
				}
				out[fmt.Sprintf("%s %s:%d", sess, a, port)] = d.Allowed
			}
		}
	}
	return out
}

// TestGateCorpus (issue 22 acceptance): random policy edits in the
// presence of live grants, each checked by the gate and by an exhaustive
// evaluation of the production Decide over a bounded key space (two
// sessions with grants, addresses and ports near every literal): no edit
// that widens a decision there is reported non-widening. The two
// shapes are the first entries.
func TestGateCorpus(t *testing.T) {
	needZ3(t)
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	e := newTestEngine(t, "")
	type edit struct{ old, neu []string }
	forbid10 := `@id("admin.no-10") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("10.0.0.0/8") };`
	corpus := []edit{
		{[]string{forbid10}, nil},
		{[]string{forbid10}, []string{strings.Replace(forbid10, "10.0.0.0/8", "10.1.0.0/16", 1)}},
		{[]string{`@id("admin.keyless") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.isEmpty() };`},
			[]string{`@id("admin.keyless") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.isEmpty() };`,
				`@id("admin.no-192") forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.cidr_keys.contains("192.168.0.0/16") };`}},
	}
	for range 60 {
		var ps []string
		for i := range r.IntN(4) {
			ps = append(ps, corpusPolicy(r, i))
		}
		corpus = append(corpus, edit{ps, corpusEdit(r, ps, 10)})
	}
	var widening, proved, reported int
	for n, ed := range corpus {
		grants := [][]string{corpusGrants[r.IntN(len(corpusGrants))], corpusGrants[r.IntN(len(corpusGrants))]}
		if n < 3 {
			grants = [][]string{{"0.0.0.0/0"}, nil} // the issue's: a 0.0.0.0/0 grant (s2: none)
		}
		before, after := corpusDecisions(t, ed.old, grants), corpusDecisions(t, ed.neu, grants)
		var widened []string
		for k, allowed := range after {
			if allowed && !before[k] {
				widened = append(widened, k)
			}
		}
		rep := e.CheckShift(withPolicies(t, e, strings.Join(ed.old, "\n")), withPolicies(t, e, strings.Join(ed.neu, "\n")))
		if rep.Proved {
			proved++
		}
		if rep.Widens() {
			reported++
		}
		if len(widened) == 0 {
			continue
		}
		widening++
		if !rep.Widens() {
			t.Errorf("seed %d edit %d: widens %v under grants %v, but the gate says %s\nold:\n%s\nnew:\n%s",
				seed, n, widened, grants, rep.Summary(), strings.Join(ed.old, "\n"), strings.Join(ed.neu, "\n"))
		}
	}
	t.Logf("seed %d: %d edits, %d widen on the key space, %d reported widening (or unproven), %d proven non-widening", seed, len(corpus), widening, reported, proved)
	if widening < 5 || proved < 5 {
		t.Errorf("the corpus is lopsided (%d widening, %d proven): it tests little", widening, proved)
	}
}
