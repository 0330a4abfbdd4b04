package dnsresolver

import (
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// testDecider is a use-time decision the test changes: names (name/port, or
// name for every port) it forbids with a rule, and every call it answered.
type testDecider struct {
	mu     sync.Mutex
	forbid map[string]string // "name" or "name/port" -> rule
	calls  []string
}

func newTestDecider() *testDecider { return &testDecider{forbid: map[string]string{}} }

func (d *testDecider) decide(session, name string, port uint16) (bool, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, session+" "+name)
	for _, k := range []string{name, name + "/" + strconv.Itoa(int(port))} {
		if rule, ok := d.forbid[k]; ok {
			return false, rule
		}
	}
	return true, "grant:test"
}

func (d *testDecider) set(k, rule string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rule == "" {
		delete(d.forbid, k)
	} else {
		d.forbid[k] = rule
	}
}

func (d *testDecider) ncalls() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.calls) }

// TestDecisionRefuses: a name the session's policy allows but the decision
// forbids is refused like a policy denial, over UDP and TCP, with the rule in
// the Denial, never forwarded upstream and with no entry written; so is an
// answer whose CNAME target the decision forbids; a grant whose port range
// the decision forbids writes nothing while another grant of the same name
// still does; allowed names resolve as before.
func TestDecisionRefuses(t *testing.T) {
	e := newTestEnv(t, nil)
	dec := newTestDecider()
	e.r.SetDecide(dec.decide)
	dec.set("api.allowed.test", "admin.no-api")
	dec.set("e1.provider.test", "hard.no-provider")

	for _, tr := range []string{"udp", "tcp"} {
		resp := e.ask(t, 1, tr, "API.allowed.test.", dns.TypeA)
		if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
			t.Fatalf("%s: forbidden name answered: %v", tr, resp)
		}
		den := e.den.take()
		if len(den) != 1 || den[0].Reason != ReasonDecision || den[0].Rule != "admin.no-api" || den[0].Session != "s1" {
			t.Fatalf("%s: denials %+v, want one decision denial naming admin.no-api", tr, den)
		}
	}
	if n := dec.ncalls(); n != 1 {
		t.Fatalf("the decision was asked %d times for the same name over UDP and TCP, want once", n)
	}
	if e.up.askedFor("api.allowed.test") {
		t.Fatal("a forbidden name was forwarded upstream")
	}
	if w := e.dp.take(); len(w) != 0 {
		t.Fatalf("entries written for a forbidden name: %v", w)
	}
	if got := e.r.Stats().Sessions["s1"].Denials[ReasonDecision]; got != 2 {
		t.Fatalf("decision denials counted %d, want 2", got)
	}

	// The CNAME chain's last target is forbidden: the whole answer is.
	resp := e.ask(t, 1, "udp", "www.chain.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
		t.Fatalf("answer with a forbidden CNAME target: %v", resp)
	}
	if den := e.den.take(); len(den) != 1 || den[0].Rule != "hard.no-provider" {
		t.Fatalf("denials %+v", den)
	}
	if w := e.dp.take(); len(w) != 0 {
		t.Fatalf("entries written for a forbidden CNAME target: %v", w)
	}

	// Allowed names still resolve and write their entries.
	resp = e.ask(t, 1, "udp", "allowed.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeSuccess || !slices.Equal(answerAddrs(resp), []string{"93.184.216.34"}) {
		t.Fatalf("allowed name: %v", resp)
	}
	if w := e.dp.take(); len(w) != 1 || w[0].Rule.Handle != h1 || w[0].Rule.Ports != portRange(443, 443) {
		t.Fatalf("entries %v", w)
	}
	dec.mu.Lock()
	asked := slices.Contains(dec.calls, "s1 allowed.test")
	dec.mu.Unlock()
	if !asked {
		t.Fatal("the decision was not asked for an allowed name")
	}

	// Two grants of one name, on 443 and on every port; port 443 forbidden:
	// only the every-port grant's entry is written.
	pol := Policy{Grants: []Grant{
		{Pattern: "api.allowed.test", Handle: h1, Ports: portRange(443, 443)},
		{Pattern: "*.allowed.test", Handle: h2},
	}}
	if err := e.r.SetPolicy("s1", pol); err != nil {
		t.Fatal(err)
	}
	dec.set("api.allowed.test", "")
	dec.set("api.allowed.test/443", "admin.no-443")
	resp = e.ask(t, 1, "udp", "api.allowed.test.", dns.TypeA)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("name with one allowed grant: %v", resp)
	}
	if w := e.dp.take(); len(w) != 1 || w[0].Rule.Handle != h2 {
		t.Fatalf("entries %v, want only the every-port grant's", w)
	}
}

// TestDecisionFastPath: a prepared reply is given without asking the
// decision again, and never once the decision may have changed: after
// DecisionsChanged a name that resolved a moment ago is refused, and
// resolves again when the decision allows it again.
func TestDecisionFastPath(t *testing.T) {
	e := newTestEnv(t, nil)
	dec := newTestDecider()
	e.r.SetDecide(dec.decide)
	ask := func() *dns.Msg { return e.ask(t, 1, "udp", "allowed.test.", dns.TypeA) }
	for range 3 {
		if resp := ask(); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("allowed name: %v", resp)
		}
	}
	if n := dec.ncalls(); n != 1 {
		t.Fatalf("the decision was asked %d times for three queries, want once (the fast path answers the others)", n)
	}
	if hits := e.r.Stats().Total.CacheHits; hits != 2 {
		t.Fatalf("cache hits %d, want 2", hits)
	}
	e.dp.take()

	dec.set("allowed.test", "admin.no-allowed")
	e.r.DecisionsChanged()
	resp := ask()
	if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
		t.Fatalf("after the decision changed, the fast path still answers: %v", resp)
	}
	if den := e.den.take(); len(den) != 1 || den[0].Reason != ReasonDecision || den[0].Rule != "admin.no-allowed" {
		t.Fatalf("denials %+v", den)
	}
	if resp := ask(); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("refused name answered on a second query: %v", resp)
	}
	if w := e.dp.take(); len(w) != 0 {
		t.Fatalf("entries written while forbidden: %v", w)
	}

	dec.set("allowed.test", "")
	e.r.DecisionsChanged()
	if resp := ask(); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("allowed again: %v", resp)
	}
	if resp := ask(); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("allowed again, second query: %v", resp)
	}

	// A policy change (a grant or session event) voids the prepared reply
	// and the remembered answer: the decision is asked again.
	dec.set("allowed.test", "admin.no-allowed")
	if resp := ask(); resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("prepared reply not given: %v", resp)
	}
	if err := e.r.SetPolicy("s1", testPolicy); err != nil {
		t.Fatal(err)
	}
	if resp := ask(); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("after SetPolicy: %v", resp)
	}
	dec.set("allowed.test", "")

	// SetDecide invalidates too.
	e.r.SetDecide(func(string, string, uint16) (bool, string) { return false, "default-deny" })
	if resp := ask(); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("after SetDecide: %v", resp)
	}
}
