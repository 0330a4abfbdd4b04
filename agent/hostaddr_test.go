package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// hostSet adds (true) or removes (false) the host address the test uses and
// returns once the agent's never-list says so.
type hostSet func(t *testing.T, a *Agent, add bool)

// testHostAddrNever: a host address (listener on it) is never-listed for
// sessions: a 0.0.0.0/0 grant does not reach it, a grant naming it exactly
// (its /32 and its port) does, with no admin policy; a /24 holding it does
// not; loopback addresses fed in are left out; once the address goes, its
// entry goes.
func testHostAddrNever(t *testing.T, d Kernel, can reach, listener string, set hostSet, afterRemove bool) {
	a, _ := neverAgent(t, d, "127.0.0.6:9100")
	ap := netip.MustParseAddrPort(listener)
	set(t, a, true)
	wide := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: wide, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	if can(t, "s1", listener) {
		t.Fatalf("%s, a host address, under 0.0.0.0/0: allowed, want denied", listener)
	}
	p24 := netip.PrefixFrom(ap.Addr(), 24).Masked()
	c24 := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{p24}, Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}}}}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: c24, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	if can(t, "s1", listener) {
		t.Fatalf("%s under a grant of %s: allowed, want denied (only the address itself is an exception)", listener, p24)
	}
	named := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), 32)}, Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}}}}
	g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: named, Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	if !can(t, "s1", listener) {
		t.Fatalf("%s under a grant naming it: denied", listener)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if can(t, "s1", listener) {
		t.Fatalf("%s after the grant naming it is revoked: allowed", listener)
	}
	set(t, a, false)
	if afterRemove && !can(t, "s1", listener) {
		t.Fatalf("%s no longer a host address, under 0.0.0.0/0: denied", listener)
	}
}

// agentNeverHas says whether the agent's never-list in force holds ip/32.
func agentNeverHas(a *Agent, ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.ContainsFunc(a.never, func(n backend.NeverEntry) bool {
		return n.Prefix == netip.PrefixFrom(ip, ip.BitLen()) && n.Port == 0
	})
}

// TestHostAddrNever: testHostAddrNever on the memory backend, the daemon's
// feed standing in for the netlink watcher.
func TestHostAddrNever(t *testing.T) {
	d := memKernel(t)
	const listener = "192.0.2.10:8080"
	ip := netip.MustParseAddrPort(listener).Addr()
	set := func(t *testing.T, a *Agent, add bool) {
		addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}
		if add {
			addrs = append(addrs, ip)
		}
		if err := a.SetHostAddrs(addrs); err != nil {
			t.Fatal(err)
		}
		if agentNeverHas(a, ip) != add {
			t.Fatalf("never-list holds %s: %v, want %v", ip, !add, add)
		}
		if agentNeverHas(a, netip.MustParseAddr("127.0.0.1")) || agentNeverHas(a, netip.MustParseAddr("::1")) {
			t.Fatal("a loopback address is on the never-list as a host address")
		}
	}
	testHostAddrNever(t, d, memReach(d), listener, set, true)
}

// TestHostAddrAllPortsKeepsOwnListener: a grant of every port on a host
// address is no exception where another never-list entry sits on that
// address (the agent's own listener on all addresses): the kernel's
// every-port exception would lift that entry too.
func TestHostAddrAllPortsKeepsOwnListener(t *testing.T) {
	d := memKernel(t)
	a, _ := neverAgent(t, d, "127.0.0.6:9100")
	ip := netip.MustParseAddr("192.0.2.10")
	if err := a.SetNeverList([]backend.NeverEntry{{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Port: 9090}}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetHostAddrs([]netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	all := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ip, 32)}}}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: all, Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	can := memReach(d)
	if can(t, "s1", "192.0.2.10:9090") || can(t, "s1", "192.0.2.10:8080") {
		t.Fatal("an every-port grant of a host address that also holds the agent's listener: allowed")
	}
	// The host set kept the resolver's entry: SetHostAddrs does not drop it.
	if !slices.ContainsFunc(a.never, func(n backend.NeverEntry) bool { return n.Port == 9090 }) {
		t.Fatal("SetHostAddrs dropped SetNeverList's entries")
	}
}
