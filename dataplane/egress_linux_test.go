package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func portOf(t testing.TB, addr string) uint16 {
	return netip.MustParseAddrPort(addr).Port()
}

// TestEgressAllowDeny: allowed destinations connect, everything else gets
// EPERM, over IPv4, IPv6 and v4-mapped IPv6, TCP and UDP, connected or not.
func TestEgressAllowDeny(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	s, err := d.CreateSession("s1", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	a := listenTCP(t, "127.0.0.2:0")
	b := listenTCP(t, "127.0.0.3:0")
	c := listenTCP(t, "127.0.0.4:0")
	v6a := listenTCP(t, "[::1]:0")
	v6b := listenTCP(t, "[::1]:0")
	ua := listenUDP(t, "127.0.0.2:0")
	ub := listenUDP(t, "127.0.0.3:0")
	u6 := listenUDP(t, "[::1]:0")

	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "s1", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoTCP, Ports: Port(portOf(t, a.addr())), Handle: h})
	// c: the whole 127.0.0.0/29 for TCP on a port range that holds c's port.
	cp := portOf(t, c.addr())
	mustAllow(t, d, "s1", EgressRule{Prefix: pfx("127.0.0.0/29"), Proto: ProtoTCP, Ports: PortRange{Lo: cp, Hi: cp}, Handle: h})
	mustAllow(t, d, "s1", EgressRule{Prefix: pfx("::1/128"), Proto: ProtoTCP, Ports: Port(portOf(t, v6a.addr())), Handle: h})
	mustAllow(t, d, "s1", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoUDP, Ports: AnyPort, Handle: h})
	mustAllow(t, d, "s1", EgressRule{Prefix: pfx("::1/128"), Proto: ProtoUDP, Ports: Port(portOf(t, u6.addr())), Handle: h})

	p := startProbe(t, s, ProcOptions{})
	cases := []struct {
		cmd, want string
	}{
		{"tcp " + a.addr(), "ok"},
		{"tcp " + b.addr(), "err EPERM"},                                   // other address
		{"tcp " + c.addr(), "ok"},                                          // covered by the /29 rule
		{"tcp 127.0.0.2:" + fmt.Sprint(cp), "err ECONNREFUSED"},            // the /29 rule covers .2 too: allowed, nobody listens there
		{"tcp " + v6a.addr(), "ok"},                                        // IPv6
		{"tcp " + v6b.addr(), "err EPERM"},                                 // IPv6, other port
		{"tcp6 " + a.addr(), "ok"},                                         // v4-mapped on an AF_INET6 socket
		{"tcp6 " + b.addr(), "err EPERM"},                                  // v4-mapped, denied
		{"udp " + ua.addr(), "ok"},                                         // UDP any port
		{"udp " + ub.addr(), "err EPERM"},                                  // UDP other address
		{"udp6 " + ub.addr(), "err EPERM"},                                 // UDP v4-mapped, denied
		{"udp " + u6.addr(), "ok"},                                         // UDP IPv6
		{"cudp " + ua.addr(), "ok"},                                        // connected UDP
		{"cudp " + ub.addr(), "err EPERM"},                                 // connected UDP denied at connect
		{"mmsg " + ub.addr(), "err EPERM"},                                 // sendmmsg
		{"udp 127.0.0.3:" + fmt.Sprint(portOf(t, ua.addr())), "err EPERM"}, // UDP rule is per address
		{"tcp 127.0.0.9:" + fmt.Sprint(cp), "err EPERM"},                   // outside the /29
		{"tfo " + b.addr(), "err EPERM"},                                   // TCP Fast Open
		{"mptcp " + b.addr(), "err EPERM"},                                 // MPTCP
		{"tcp 10.255.255.1:80", "err EPERM"},                               // never leaves the host: denied before routing
	}
	for _, tc := range cases {
		t.Run(tc.cmd, func(t *testing.T) {
			if got := p.Do(tc.cmd); got != tc.want {
				t.Errorf("%s: got %q, want %q", tc.cmd, got, tc.want)
			}
		})
	}
	expectData(t, ua.data, "x")
	expectData(t, u6.data, "x")
	expectNoData(t, ub.data, 200*time.Millisecond)

	// Processes outside the sessions' parent are never affected: this test
	// process is one.
	conn, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatalf("outside the parent, %s must be reachable: %v", b.addr(), err)
	}
	conn.Close()

	// The denials were counted per reason.
	cnt, err := d.Counters(s.Index)
	if err != nil {
		t.Fatal(err)
	}
	if cnt[ReasonNoRule] < 10 {
		t.Errorf("no_rule denials counted %d, want >= 10 (%v)", cnt[ReasonNoRule], cnt)
	}
}

// TestEventsAndCounters: a denial is an event with session, pid, comm,
// destination and reason, and a counter.
func TestEventsAndCounters(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	s, err := d.CreateSession("ev", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	p := startProbe(t, s, ProcOptions{})
	pid := strings.TrimPrefix(p.Do("pid"), "ok ")
	if got := p.Do("tcp 127.0.0.9:4242"); got != "err EPERM" {
		t.Fatalf("got %q", got)
	}
	rd.SetDeadline(time.Now().Add(3 * time.Second))
	ev, err := rd.Read()
	if err != nil {
		t.Fatalf("read event: %v", err)
	}
	want := netip.MustParseAddrPort("127.0.0.9:4242")
	if ev.Session != s.Index || ev.CgroupID != s.CgroupID || fmt.Sprint(ev.PID) != pid || ev.Reason != ReasonNoRule ||
		ev.Dst != want || ev.Proto != ProtoTCP || ev.Comm != "probe" {
		t.Errorf("event %+v: want session %d cgroup %d pid %s reason no_rule dst %v proto tcp comm probe", ev, s.Index, s.CgroupID, pid, want)
	}
	if d := time.Since(ev.Time); d < -time.Second || d > 10*time.Second {
		t.Errorf("event time %v is off by %v", ev.Time, d)
	}
	cnt, _ := d.Counters(s.Index)
	if cnt[ReasonNoRule] != 1 {
		t.Errorf("counters %v, want one no_rule", cnt)
	}
}

// TestRevoke: a revoke makes the very next attempt fail and stops traffic on
// a TCP connection and a connected UDP socket opened before it.
func TestRevoke(t *testing.T) { forModes(t, testRevoke) }

func testRevoke(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	if d.FlowMode() != mode {
		t.Fatalf("flow mode %s, want %s", d.FlowMode(), mode)
	}
	s, _ := d.CreateSession("rv", Limits{})
	srv := listenTCP(t, "127.0.0.2:0")
	us := listenUDP(t, "127.0.0.2:0")
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "rv", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: h})

	p := startProbe(t, s, ProcOptions{})
	if got := p.Do("open c1 tcp " + srv.addr()); got != "ok" {
		t.Fatalf("open: %s", got)
	}
	if got := p.Do("open u1 udp " + us.addr()); got != "ok" {
		t.Fatalf("open udp: %s", got)
	}
	if got := p.Do("write c1 before"); got != "ok" {
		t.Fatalf("write: %s", got)
	}
	expectData(t, srv.data, "before")
	p.Do("write u1 before")
	expectData(t, us.data, "before")

	rd, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	pid := strings.TrimPrefix(p.Do("pid"), "ok ")
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("tcp " + srv.addr()); got != "err EPERM" {
		t.Errorf("connect after revoke: %s", got)
	}
	if got := p.Do("udp " + us.addr()); got != "err EPERM" {
		t.Errorf("sendto after revoke: %s", got)
	}
	// The open flows: packet mode drops their packets from now on; sweep
	// mode destroyed their sockets before Revoke returned, so writes fail.
	w1, w2 := p.Do("write c1 after"), p.Do("write u1 after")
	if mode == FlowSweep && (w1 == "ok" || w2 == "ok") {
		t.Errorf("writes on destroyed sockets: tcp %q, udp %q (want errors)", w1, w2)
	}
	expectNoData(t, srv.data, 700*time.Millisecond)
	expectNoData(t, us.data, 100*time.Millisecond)
	// The cut is an event naming the session and the peer (and, in packet
	// mode, where the sending task is known, the process).
	rd.SetDeadline(time.Now().Add(3 * time.Second))
	found := false
	for !found {
		ev, err := rd.Read()
		if err != nil {
			t.Fatalf("no flow_revoked event: %v", err)
		}
		found = ev.Reason == ReasonFlowRevoked && ev.Session == s.Index && ev.Dst.Addr() == netip.MustParseAddr("127.0.0.2")
		if found && mode == FlowPacket && skbTaskInfo() && (fmt.Sprint(ev.PID) != pid || ev.Comm != "probe") {
			t.Errorf("packet-mode event: pid %d comm %q, want %s probe", ev.PID, ev.Comm, pid)
		}
	}
	cnt, _ := d.Counters(s.Index)
	if cnt[ReasonFlowRevoked] == 0 || cnt[ReasonHandleRevoked] < 2 {
		t.Errorf("counters %v: want flow_revoked and handle_revoked denials", cnt)
	}
	if mode == FlowSweep {
		if st := d.SweepStats(); st.Destroyed < 2 || st.LastErr != nil {
			t.Errorf("sweep stats %+v: want >= 2 sockets destroyed, no error", st)
		}
	}
	// Revoke is idempotent.
	if err := d.Revoke(h); err != nil {
		t.Errorf("second revoke: %v", err)
	}
	// A new grant covering the same peer: in packet mode the connected UDP
	// socket talks again (a flow lives while some live grant covers it); in
	// sweep mode that socket is gone for good and a new one works.
	h2 := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "rv", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: h2})
	drain(us.data)
	if mode == FlowPacket {
		p.Do("write u1 regranted")
	} else {
		if got := p.Do("open u2 udp " + us.addr()); got != "ok" {
			t.Fatalf("open udp after re-grant: %s", got)
		}
		p.Do("write u2 regranted")
	}
	expectData(t, us.data, "regranted")
}

// TestMembrane: revoking a parent kills every attenuated descendant; a child
// revoke leaves the parent alive.
func TestMembrane(t *testing.T) { forModes(t, testMembrane) }

func testMembrane(t *testing.T, mode FlowMode) {
	d := newDataplane(t, modeConfig(t, mode))
	s, _ := d.CreateSession("mb", Limits{})
	a := listenTCP(t, "127.0.0.2:0")
	b := listenTCP(t, "127.0.0.3:0")
	root := mustHandle(t, d, HandleRef{}, time.Time{})
	child := mustHandle(t, d, root, time.Time{})
	grandchild := mustHandle(t, d, child, time.Time{})
	sibling := mustHandle(t, d, root, time.Time{})
	mustAllow(t, d, "mb", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: grandchild})
	mustAllow(t, d, "mb", EgressRule{Prefix: pfx("127.0.0.3/32"), Handle: sibling})
	p := startProbe(t, s, ProcOptions{})
	for _, addr := range []string{a.addr(), b.addr()} {
		if got := p.Do("tcp " + addr); got != "ok" {
			t.Fatalf("before revoke %s: %s", addr, got)
		}
	}
	// Open flows under the grandchild and the sibling.
	if got := p.Do("open ca tcp " + a.addr()); got != "ok" {
		t.Fatal(got)
	}
	if got := p.Do("open cb tcp " + b.addr()); got != "ok" {
		t.Fatal(got)
	}
	if err := d.Revoke(child); err != nil {
		t.Fatal(err)
	}
	p.Do("write ca cut")
	p.Do("write cb alive")
	expectData(t, b.data, "alive")
	expectNoData(t, a.data, 500*time.Millisecond)
	if got := p.Do("tcp " + a.addr()); got != "err EPERM" {
		t.Errorf("grandchild after child revoke: %s", got)
	}
	if got := p.Do("tcp " + b.addr()); got != "ok" {
		t.Errorf("sibling after child revoke: %s", got)
	}
	// A live child cannot be made under a dead parent.
	if _, err := d.NewHandle(child, time.Time{}); !isErr(err, ErrHandleNotLive) {
		t.Errorf("child of a revoked handle: %v, want ErrHandleNotLive", err)
	}
	if err := d.Revoke(root); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("tcp " + b.addr()); got != "err EPERM" {
		t.Errorf("sibling after root revoke: %s", got)
	}
	// The chain depth is bounded.
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	for i := 1; i < MaxChain; i++ {
		h = mustHandle(t, d, h, time.Time{})
	}
	if _, err := d.NewHandle(h, time.Time{}); !isErr(err, ErrChainTooDeep) {
		t.Errorf("handle %d deep: %v, want ErrChainTooDeep", MaxChain+1, err)
	}
}

// TestExpiry: an expired handle (or ancestor) denies; an expired rule denies.
func TestExpiry(t *testing.T) { forModes(t, testExpiry) }

func testExpiry(t *testing.T, mode FlowMode) {
	cfg := modeConfig(t, mode)
	// The kernel's own expiry: the collector, which removes the expired
	// rule (later denials then say no_rule), waits (TestExpiredEntriesCollected).
	cfg.ExpiryInterval = time.Minute
	d := newDataplane(t, cfg)
	s, _ := d.CreateSession("ex", Limits{})
	a := listenTCP(t, "127.0.0.2:0")
	b := listenTCP(t, "127.0.0.3:0")
	c := listenTCP(t, "127.0.0.4:0")
	soon := time.Now().Add(400 * time.Millisecond)
	parent := mustHandle(t, d, HandleRef{}, soon)
	child := mustHandle(t, d, parent, time.Time{}) // no own expiry: dies with its parent
	forever := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "ex", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: parent})
	mustAllow(t, d, "ex", EgressRule{Prefix: pfx("127.0.0.3/32"), Handle: child})
	mustAllow(t, d, "ex", EgressRule{Prefix: pfx("127.0.0.4/32"), Handle: forever, Expires: soon}) // a DNS-TTL style entry
	p := startProbe(t, s, ProcOptions{})
	for _, addr := range []string{a.addr(), b.addr(), c.addr()} {
		if got := p.Do("tcp " + addr); got != "ok" {
			t.Fatalf("before expiry %s: %s", addr, got)
		}
	}
	// Open flows: under the expiring child (cut at the deadline), and under
	// the rule with a TTL (rule deadlines bound new connections only).
	if got := p.Do("open cb tcp " + b.addr()); got != "ok" {
		t.Fatal(got)
	}
	if got := p.Do("open cc tcp " + c.addr()); got != "ok" {
		t.Fatal(got)
	}
	drain(b.data)
	time.Sleep(time.Until(soon) + 50*time.Millisecond)
	p.Do("write cb expired")
	p.Do("write cc ttl")
	expectData(t, c.data, "ttl")
	expectNoData(t, b.data, 500*time.Millisecond)
	for _, addr := range []string{a.addr(), b.addr(), c.addr()} {
		if got := p.Do("tcp " + addr); got != "err EPERM" {
			t.Errorf("after expiry %s: %s", addr, got)
		}
	}
	cnt, _ := d.Counters(s.Index)
	if cnt[ReasonHandleExpired] != 2 || cnt[ReasonRuleExpired] != 1 {
		t.Errorf("counters %v: want 2 handle_expired, 1 rule_expired", cnt)
	}
}

// TestRecycledSlot: a freed slot reissued under a new generation never
// revives entries or sockets that named the old handle.
func TestRecycledSlot(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	s, _ := d.CreateSession("rc", Limits{})
	a := listenTCP(t, "127.0.0.2:0")
	old := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "rc", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: old})
	p := startProbe(t, s, ProcOptions{})
	if got := p.Do("open c tcp " + a.addr()); got != "ok" {
		t.Fatal(got)
	}
	if err := d.Revoke(old); err != nil {
		t.Fatal(err)
	}
	if err := d.FreeHandle(old); err != nil {
		t.Fatal(err)
	}
	fresh := mustHandle(t, d, HandleRef{}, time.Time{})
	if fresh.Slot != old.Slot || fresh.Generation == old.Generation {
		t.Fatalf("expected the slot to be recycled under a new generation: old %s new %s", old, fresh)
	}
	if got := p.Do("tcp " + a.addr()); got != "err EPERM" {
		t.Errorf("entry naming the old generation: %s", got)
	}
	p.Do("write c stale")
	expectNoData(t, a.data, 500*time.Millisecond)
	// Revoking or freeing the old reference again does nothing to the new one.
	if err := d.Revoke(old); err != nil {
		t.Errorf("revoke stale ref: %v", err)
	}
	if err := d.FreeHandle(old); !isErr(err, ErrHandleNotLive) {
		t.Errorf("free stale ref: %v, want ErrHandleNotLive", err)
	}
	// Allowing under a stale reference is refused.
	if err := d.AllowEgress("rc", EgressRule{Prefix: pfx("127.0.0.3/32"), Handle: old}); !isErr(err, ErrHandleNotLive) {
		t.Errorf("allow under stale ref: %v", err)
	}
	mustAllow(t, d, "rc", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: fresh})
	if got := p.Do("tcp " + a.addr()); got != "ok" {
		t.Errorf("fresh handle: %s", got)
	}
}

// TestBadInput: a typed error, and the maps are exactly as they were.
func TestBadInput(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxEgress4 = 4
	d := newDataplane(t, cfg)
	if _, err := d.CreateSession("bi", Limits{}); err != nil {
		t.Fatal(err)
	}
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "bi", EgressRule{Prefix: pfx("10.0.0.0/8"), Proto: ProtoTCP, Ports: Port(443), Handle: h})
	before := snapshot(t, d, "bi")

	cases := []struct {
		name string
		sess string
		rule EgressRule
		want error
	}{
		{"host bits set", "bi", EgressRule{Prefix: pfx("10.1.2.3/8"), Handle: h}, ErrInvalidPrefix},
		{"invalid prefix", "bi", EgressRule{Prefix: netip.Prefix{}, Handle: h}, ErrInvalidPrefix},
		{"v4-mapped prefix", "bi", EgressRule{Prefix: pfx("::ffff:10.0.0.0/104"), Handle: h}, ErrInvalidPrefix},
		{"port 0 in range", "bi", EgressRule{Prefix: pfx("10.0.0.1/32"), Ports: PortRange{Lo: 0, Hi: 80}, Handle: h}, ErrInvalidPorts},
		{"empty range", "bi", EgressRule{Prefix: pfx("10.0.0.1/32"), Ports: PortRange{Lo: 90, Hi: 80}, Handle: h}, ErrInvalidPorts},
		{"bad proto", "bi", EgressRule{Prefix: pfx("10.0.0.1/32"), Proto: 1, Handle: h}, ErrInvalidProto},
		{"no handle", "bi", EgressRule{Prefix: pfx("10.0.0.1/32")}, ErrInvalidHandle},
		{"forged handle", "bi", EgressRule{Prefix: pfx("10.0.0.1/32"), Handle: HandleRef{Slot: h.Slot, Generation: h.Generation + 7}}, ErrHandleNotLive},
		{"slot out of range", "bi", EgressRule{Prefix: pfx("10.0.0.1/32"), Handle: HandleRef{Slot: 1 << 30, Generation: 1}}, ErrInvalidHandle},
		{"unknown session", "nope", EgressRule{Prefix: pfx("10.0.0.1/32"), Handle: h}, ErrSessionNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := d.AllowEgress(tc.sess, tc.rule); !isErr(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if after := snapshot(t, d, "bi"); after != before {
				t.Fatalf("maps changed:\n%s\n->\n%s", before, after)
			}
		})
	}
	t.Run("rules full", func(t *testing.T) {
		for p := uint16(1); p < MaxRules; p++ {
			mustAllow(t, d, "bi", EgressRule{Prefix: pfx("10.0.0.0/8"), Ports: Port(p), Handle: h})
		}
		before := snapshot(t, d, "bi")
		if err := d.AllowEgress("bi", EgressRule{Prefix: pfx("10.0.0.0/8"), Ports: Port(999), Handle: h}); !isErr(err, ErrRulesFull) {
			t.Fatalf("got %v, want ErrRulesFull", err)
		}
		if after := snapshot(t, d, "bi"); after != before {
			t.Fatalf("maps changed")
		}
	})
	t.Run("map full", func(t *testing.T) {
		var err error
		for i := 0; i < 8 && err == nil; i++ {
			err = d.AllowEgress("bi", EgressRule{Prefix: pfx(fmt.Sprintf("192.0.2.%d/32", i)), Handle: h})
		}
		if !isErr(err, ErrMapFull) {
			t.Fatalf("got %v, want ErrMapFull", err)
		}
		before := snapshot(t, d, "bi")
		if err := d.AllowEgress("bi", EgressRule{Prefix: pfx("198.51.100.1/32"), Handle: h}); !isErr(err, ErrMapFull) {
			t.Fatalf("got %v, want ErrMapFull", err)
		}
		if after := snapshot(t, d, "bi"); after != before {
			t.Fatalf("maps changed")
		}
	})
	t.Run("remove unknown rule", func(t *testing.T) {
		if err := d.RemoveEgress("bi", EgressRule{Prefix: pfx("203.0.113.0/24"), Handle: h}); !isErr(err, ErrRuleNotFound) {
			t.Fatalf("got %v, want ErrRuleNotFound", err)
		}
	})
	t.Run("bad session names", func(t *testing.T) {
		for _, n := range []string{"", ".", "..", "a/b", "-x", strings.Repeat("a", 65), "a\x00b"} {
			if _, err := d.CreateSession(n, Limits{}); !isErr(err, ErrInvalidSession) {
				t.Errorf("session %q: %v, want ErrInvalidSession", n, err)
			}
		}
		if _, err := d.CreateSession("bi", Limits{}); !isErr(err, ErrSessionExists) {
			t.Errorf("duplicate session: %v", err)
		}
		if err := d.DestroySession("nope"); !isErr(err, ErrSessionNotFound) {
			t.Errorf("destroy unknown: %v", err)
		}
	})
}

// snapshot renders a session's rules and the handle table.
func snapshot(t testing.TB, d *Dataplane, sess string) string {
	t.Helper()
	rules, err := d.EgressRules(sess)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := d.Handles()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	lines := make([]string, 0, len(rules))
	for _, r := range rules {
		lines = append(lines, r.String())
	}
	sort.Strings(lines)
	b.WriteString(strings.Join(lines, "\n"))
	fmt.Fprintf(&b, "\nhandles=%v", hs)
	return b.String()
}

// TestCoverChain: nested prefixes are each tried, longest first, so a rule on
// a covering prefix still applies when a longer prefix's rules do not match.
func TestCoverChain(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	s, _ := d.CreateSession("cv", Limits{})
	a := listenTCP(t, "127.0.0.2:0")
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "cv", EgressRule{Prefix: pfx("127.0.0.0/8"), Proto: ProtoTCP, Ports: Port(portOf(t, a.addr())), Handle: h})
	mustAllow(t, d, "cv", EgressRule{Prefix: pfx("127.0.0.0/16"), Proto: ProtoUDP, Handle: h})
	mustAllow(t, d, "cv", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoTCP, Ports: Port(1), Handle: h})
	p := startProbe(t, s, ProcOptions{})
	if got := p.Do("tcp " + a.addr()); got != "ok" {
		t.Errorf("covered by the /8 behind a /32 and a /16: %s", got)
	}
	// Deeper nesting than the kernel walks is refused up front.
	var err error
	for bits := 17; bits <= 31 && err == nil; bits++ {
		err = d.AllowEgress("cv", EgressRule{Prefix: netip.PrefixFrom(netip.MustParseAddr("127.0.0.2"), bits).Masked(), Handle: h})
	}
	if !isErr(err, ErrCoverTooDeep) {
		t.Errorf("deep nesting: %v, want ErrCoverTooDeep", err)
	}
}

// TestSessionLifecycle: a destroyed session's entries are gone, its index is
// reused cleanly, and a process in the parent itself (no session) is denied.
func TestSessionLifecycle(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	a := listenTCP(t, "127.0.0.2:0")
	s1, _ := d.CreateSession("one", Limits{})
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "one", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: h})
	p := startProbe(t, s1, ProcOptions{})
	if got := p.Do("tcp " + a.addr()); got != "ok" {
		t.Fatal(got)
	}
	occ := func(m string) int {
		for _, o := range d.Occupancy() {
			if o.Map == m {
				return o.Entries
			}
		}
		t.Fatalf("no map %s", m)
		return 0
	}
	if occ("exact4") != 1 || occ("egress4") != 0 || occ("sessions") != 1 {
		t.Errorf("occupancy before destroy: %+v", d.Occupancy())
	}
	if err := d.DestroySession("one"); err != nil {
		t.Fatal(err)
	}
	if occ("exact4") != 0 || occ("sessions") != 0 {
		t.Errorf("occupancy after destroy: %+v", d.Occupancy())
	}
	if _, err := os.Stat(s1.Path); !os.IsNotExist(err) {
		t.Errorf("session cgroup still there: %v", err)
	}
	s2, err := d.CreateSession("two", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if s2.Index != s1.Index {
		t.Logf("index not reused (%d vs %d)", s2.Index, s1.Index)
	}
	p2 := startProbe(t, s2, ProcOptions{})
	if got := p2.Do("tcp " + a.addr()); got != "err EPERM" {
		t.Errorf("new session inherited the old one's entries: %s", got)
	}
	// The parent itself is no session.
	parent := Session{Name: "(parent)", Path: d.ParentPath()}
	p3 := startProbe(t, parent, ProcOptions{})
	if got := p3.Do("tcp " + a.addr()); got != "err EPERM" {
		t.Errorf("process in the parent cgroup: %s", got)
	}
	cnt, _ := d.Counters(0)
	if cnt[ReasonUnknownSession] == 0 {
		t.Errorf("unknown-session denial not counted: %v", cnt)
	}
}
