package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestNeverList: never-listed destinations are refused in the kernel before
// any grant is consulted: a 0.0.0.0/0 grant does not reach 169.254.169.254
// nor a never-listed listener; a rule marked NeverOK (an admin-named grant)
// does.
func TestNeverList(t *testing.T) { forModes(t, testNeverList) }

func testNeverList(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	s, err := d.CreateSession("nv", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	agentish := listenTCP(t, "127.0.0.5:0") // stands for one of the agent's listeners
	other := listenTCP(t, "127.0.0.5:0")
	port := netip.MustParseAddrPort(agentish.addr()).Port()
	if err := d.SetNeverList(append(DefaultNeverList(), NeverEntry{Prefix: pfx("127.0.0.5/32"), Port: port})); err != nil {
		t.Fatal(err)
	}
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "nv", EgressRule{Prefix: pfx("0.0.0.0/0"), Handle: h})
	mustAllow(t, d, "nv", EgressRule{Prefix: pfx("::/0"), Handle: h})
	p := startProbe(t, s, ProcOptions{})
	for _, dst := range []string{"169.254.169.254:80", "169.254.170.2:80", "[fd00:ec2::254]:80", agentish.addr()} {
		cmd := "tcp " + dst
		if dst[0] == '[' {
			cmd = "tcp6 " + dst
		}
		if got := p.Do(cmd); got != "err EPERM" {
			t.Errorf("%s under a 0.0.0.0/0 grant: %s, want err EPERM", dst, got)
		}
	}
	if got := p.Do("tcp " + other.addr()); got != "ok" {
		t.Fatalf("same address, a port not listed: %s", got)
	}
	cnt, _ := d.Counters(s.Index)
	if cnt[ReasonNoRule] < 4 {
		t.Errorf("counters %v: want the never-list refusals as no_rule", cnt)
	}
	// an admin-named grant: the rule is NeverOK
	h2 := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "nv", EgressRule{Prefix: pfx("127.0.0.5/32"), Ports: Port(port), Handle: h2, NeverOK: true})
	if got := p.Do("tcp " + agentish.addr()); got != "ok" {
		t.Fatalf("never-listed destination under a NeverOK rule: %s", got)
	}
	rules, _ := d.EgressRules("nv")
	found := false
	for _, r := range rules {
		found = found || r.NeverOK && r.Prefix == pfx("127.0.0.5/32")
	}
	if !found {
		t.Fatalf("EgressRules lost the NeverOK flag: %v", rules)
	}
	// the list can shrink: the listener is reachable under 0/0 again
	if err := d.SetNeverList(DefaultNeverList()); err != nil {
		t.Fatal(err)
	}
	if err := d.Revoke(h2); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("tcp " + agentish.addr()); got != "ok" {
		t.Fatalf("after the listener left the list: %s", got)
	}
}

func DefaultNeverList() []NeverEntry { return append([]NeverEntry(nil), backend.DefaultNeverList...) }

// TestNeverExceptionShared: two grants of one session that both name the
// same never-listed destination share its one exception entry
// (shk_never_oks is keyed by session and destination): revoking either
// (handle, then its rules) leaves the other's exception in force, in both
// orders, and revoking both removes it.
func TestNeverExceptionShared(t *testing.T) {
	// The exception's bookkeeping is the same in both flow modes: the
	// first this kernel has (Debian 12's 6.1 has no sweep mode).
	d := newDataplane(t, modeConfig(t, flowModes(t)[0]))
	s, err := d.CreateSession("nvs", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ln := listenTCP(t, "127.0.0.6:0")
	port := netip.MustParseAddrPort(ln.addr()).Port()
	if err := d.SetNeverList(append(DefaultNeverList(), NeverEntry{Prefix: pfx("127.0.0.6/32"), Port: port})); err != nil {
		t.Fatal(err)
	}
	p := startProbe(t, s, ProcOptions{})
	connect := func() string { return p.Do("tcp " + ln.addr()) }
	if got := connect(); got != "err EPERM" {
		t.Fatalf("never-listed, no grant: %s", got)
	}
	grant := func() (HandleRef, EgressRule) {
		h := mustHandle(t, d, HandleRef{}, time.Time{})
		r := EgressRule{Prefix: pfx("127.0.0.6/32"), Ports: Port(port), Handle: h, NeverOK: true}
		mustAllow(t, d, "nvs", r)
		return h, r
	}
	drop := func(h HandleRef, r EgressRule) {
		t.Helper()
		if err := d.Revoke(h); err != nil {
			t.Fatal(err)
		}
		if err := d.Release("nvs", h, backend.DeltaOf([]EgressRule{r})); err != nil {
			t.Fatal(err)
		}
	}
	for _, firstGoesFirst := range []bool{true, false} {
		h1, r1 := grant()
		h2, r2 := grant()
		if got := connect(); got != "ok" {
			t.Fatalf("two grants naming it: %s", got)
		}
		a, ra, b, rb := h1, r1, h2, r2
		if !firstGoesFirst {
			a, ra, b, rb = h2, r2, h1, r1
		}
		if err := d.Revoke(a); err != nil {
			t.Fatal(err)
		}
		if got := connect(); got != "ok" {
			t.Fatalf("one of two grants revoked (first=%v), before its release: %s, want ok (the other still names it)", firstGoesFirst, got)
		}
		if err := d.Release("nvs", a, backend.DeltaOf([]EgressRule{ra})); err != nil {
			t.Fatal(err)
		}
		if got := connect(); got != "ok" {
			t.Fatalf("one of two grants revoked and released (first=%v): %s, want ok (the other still names it)", firstGoesFirst, got)
		}
		drop(b, rb)
		if got := connect(); got != "err EPERM" {
			t.Fatalf("both grants gone (first=%v): %s, want err EPERM", firstGoesFirst, got)
		}
		var k shkShkNeverOkKey
		var v shkShkNeverOk
		n := 0
		for it := d.objs.ShkNeverOks.Iterate(); it.Next(&k, &v); {
			if k.Session == s.Index {
				n++
			}
		}
		if n != 0 {
			t.Fatalf("both grants gone (first=%v): %d exception entries left for the session", firstGoesFirst, n)
		}
	}
}
