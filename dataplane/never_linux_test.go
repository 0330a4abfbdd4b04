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
	s, err := d.CreateSession("nv")
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
