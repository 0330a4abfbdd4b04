package backendtest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The use subtests make connects through the User role. Destinations are
// loopback addresses on ports nothing listens on: a kernel backend's
// allowed connect is then refused by the peer at once, which is still
// allowed.

func wantUse(t *testing.T, u User, session, dst string, proto backend.Proto, want backend.Reason) {
	t.Helper()
	got, err := u.Connect(session, netip.MustParseAddrPort(dst), proto)
	if err != nil {
		t.Fatalf("connect %s to %s: %v", session, dst, err)
	}
	if got != want {
		t.Fatalf("connect %s to %s (%s): %s, want %s", session, dst, proto, got, want)
	}
}

// testUseLookup: the longest covering entry is tried first, then shorter
// ones; every rule of an entry is tried; protocol and ports must match;
// nothing matching reads no_rule; a dead match reads why.
func testUseLookup(t *testing.T, s *suite) {
	b, u := s.user(t)
	mustSession(t, b, "s1")
	mustSession(t, b, "s2")
	tcp := backend.ProtoTCP
	wantUse(t, u, "s1", "127.0.0.2:40001", tcp, backend.ReasonNoRule)
	live := mustHandle(t, b, backend.HandleRef{})
	dead := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{
		egress("127.0.0.2", 40001, dead), // the exact entry: a dead rule first,
		egress("127.0.0.2", 40001, live), // then a live one
		egress("127.0.0.3", 40001, dead), // only dead here: falls through to the /24
		egress("127.0.0.0/24", 40002, live),
		{Prefix: prefixOf("127.0.0.4"), Proto: backend.ProtoUDP, Ports: backend.Port(40003), Handle: live},
		{Prefix: prefixOf("127.0.0.5"), Ports: backend.PortRange{Lo: 40010, Hi: 40020}, Handle: live},
		egress("::1", 40001, live),
	}})
	mustRevoke(t, b, dead)
	wantUse(t, u, "s1", "127.0.0.2:40001", tcp, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.3:40001", tcp, backend.ReasonHandleRevoked)
	wantUse(t, u, "s1", "127.0.0.3:40002", tcp, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.9:40002", tcp, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.9:40003", tcp, backend.ReasonNoRule)
	wantUse(t, u, "s1", "127.0.0.4:40003", tcp, backend.ReasonNoRule)
	wantUse(t, u, "s1", "127.0.0.4:40003", backend.ProtoUDP, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.5:40009", tcp, backend.ReasonNoRule)
	wantUse(t, u, "s1", "127.0.0.5:40010", tcp, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.5:40020", tcp, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.5:40021", tcp, backend.ReasonNoRule)
	wantUse(t, u, "s1", "[::1]:40001", tcp, backend.ReasonNone)
	wantUse(t, u, "s1", "[::1]:40002", tcp, backend.ReasonNoRule)
	// Another session's entries are not this one's.
	wantUse(t, u, "s2", "127.0.0.2:40001", tcp, backend.ReasonNoRule)
	wantUse(t, u, "s2", "127.0.0.9:40002", tcp, backend.ReasonNoRule)
	// Inbound rules never allow a connect.
	mustApply(t, b, "s2", backend.Delta{Inbound: []backend.EgressRule{inbound("127.0.0.0/24", 0, live)}})
	wantUse(t, u, "s2", "127.0.0.2:40001", tcp, backend.ReasonNoRule)
	// Counters: every denial of s1 above, by reason.
	s1, _ := b.Session("s1")
	c, err := b.Counters(s1.Index)
	if err != nil {
		t.Fatal(err)
	}
	if c[backend.ReasonNoRule] < 6 || c[backend.ReasonHandleRevoked] < 1 {
		t.Fatalf("counters of s1: %v, want at least 6 no_rule and 1 handle_revoked", c)
	}
}

// testUseMembrane: after a parent's revoke, no use passes under any
// descendant, in any session; a sibling tree is untouched.
func testUseMembrane(t *testing.T, s *suite) {
	b, u := s.user(t)
	mustSession(t, b, "s1")
	mustSession(t, b, "sub")
	root := mustHandle(t, b, backend.HandleRef{})
	c := mustHandle(t, b, root)
	g := mustHandle(t, b, c)
	other := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.0/24", 0, root)}})
	mustApply(t, b, "sub", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 40001, c), egress("127.0.0.3", 40001, g), egress("127.0.0.4", 40001, other)}})
	for _, dst := range []string{"127.0.0.2:40001", "127.0.0.3:40001", "127.0.0.4:40001"} {
		wantUse(t, u, "sub", dst, backend.ProtoTCP, backend.ReasonNone)
	}
	wantUse(t, u, "s1", "127.0.0.7:40005", backend.ProtoTCP, backend.ReasonNone)
	mustRevoke(t, b, root)
	wantUse(t, u, "s1", "127.0.0.7:40005", backend.ProtoTCP, backend.ReasonHandleRevoked)
	wantUse(t, u, "sub", "127.0.0.2:40001", backend.ProtoTCP, backend.ReasonHandleRevoked)
	wantUse(t, u, "sub", "127.0.0.3:40001", backend.ProtoTCP, backend.ReasonHandleRevoked)
	wantUse(t, u, "sub", "127.0.0.4:40001", backend.ProtoTCP, backend.ReasonNone)
}

// testUseGenerations: an entry left under a freed handle is not revived
// when its slot is handed out again.
func testUseGenerations(t *testing.T, s *suite) {
	b, u := s.user(t)
	mustSession(t, b, "s1")
	old := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 40001, old)}})
	mustRevoke(t, b, old)
	// The slot alone: the entry stays behind, naming the old reference.
	if err := b.Release("", old, backend.Delta{}); err != nil {
		t.Fatal(err)
	}
	var fresh backend.HandleRef
	for i := 0; i < 64 && fresh.IsZero(); i++ {
		if h := mustHandle(t, b, backend.HandleRef{}); h.Slot == old.Slot {
			fresh = h
		}
	}
	if fresh.IsZero() {
		t.Skipf("%T did not hand slot %d out again in 64 issues", b, old.Slot)
	}
	wantUse(t, u, "s1", "127.0.0.2:40001", backend.ProtoTCP, backend.ReasonHandleRevoked)
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.3", 40001, fresh)}})
	wantUse(t, u, "s1", "127.0.0.3:40001", backend.ProtoTCP, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.2:40001", backend.ProtoTCP, backend.ReasonHandleRevoked)
}

// testUseOnce: the first allowed use consumes an approve-once handle (it
// reads used); the next use under it is refused; its parent is not
// consumed; revoke still works.
func testUseOnce(t *testing.T, s *suite) {
	b, u := s.user(t)
	mustSession(t, b, "s1")
	p := mustHandle(t, b, backend.HandleRef{})
	o, err := b.NewOnceHandle(p, never)
	if err != nil {
		t.Skipf("%T issues no approve-once handles: %v", b, err)
	}
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 40001, o), egress("127.0.0.3", 40001, p)}})
	wantState(t, b, o, backend.HandleOnce)
	// A use that does not match the once rule does not consume it.
	wantUse(t, u, "s1", "127.0.0.2:40002", backend.ProtoTCP, backend.ReasonNoRule)
	wantState(t, b, o, backend.HandleOnce)
	wantUse(t, u, "s1", "127.0.0.2:40001", backend.ProtoTCP, backend.ReasonNone)
	wantState(t, b, o, backend.HandleUsed)
	wantState(t, b, p, backend.HandleLive)
	wantUse(t, u, "s1", "127.0.0.2:40001", backend.ProtoTCP, backend.ReasonHandleRevoked)
	wantUse(t, u, "s1", "127.0.0.3:40001", backend.ProtoTCP, backend.ReasonNone)
	if row, ok := handleIn(snapshot(t, b), o); !ok || row.State != backend.HandleUsed || !row.State.Alive() {
		t.Fatalf("snapshot row of the spent once handle: %+v (found %v)", row, ok)
	}
	if ops := opsDelta(b, func() { mustRevoke(t, b, o) }); ops.RevokeWrites != 1 {
		t.Fatalf("revoking a spent once handle cost %+v", ops)
	}
	wantState(t, b, o, backend.HandleRevoked)
}

// testUseExpiry: a handle's deadline ends its subtree; an entry's own
// deadline (a DNS answer's TTL) ends the entry.
//
// The deadline must outlast the apply and the three uses before it. A use is
// timed first and the margin scaled from it, but under emulation (the VM of
// .ci/vmtest, with the suite's subtests running in parallel) an apply can
// stall far longer than a use. When the uses before the deadline end after
// it (or one of them already reads expired), the attempt cannot judge
// expiry: it is made again on fresh ports with twice the margin, up to four
// times. A use refused for any other reason fails at once.
func testUseExpiry(t *testing.T, s *suite) {
	b, u := s.user(t)
	mustSession(t, b, "s1")
	long := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.5", 40001, long)}})
	t0 := time.Now()
	wantUse(t, u, "s1", "127.0.0.5:40001", backend.ProtoTCP, backend.ReasonNone)
	margin := 400*time.Millisecond + 10*time.Since(t0)
	for attempt := 0; ; attempt++ {
		port := 40010 + attempt
		soon := time.Now().Add(margin)
		h, err := b.NewHandle(backend.HandleRef{}, soon)
		if err != nil {
			t.Fatal(err)
		}
		c := mustHandle(t, b, h)
		ttl := egress("127.0.0.4", uint16(port), long)
		ttl.Expires = soon
		mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{
			egress("127.0.0.2", uint16(port), h), egress("127.0.0.3", uint16(port), c), ttl}})
		late := false
		for _, a := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
			dst := netip.AddrPortFrom(netip.MustParseAddr(a), uint16(port))
			got, err := u.Connect("s1", dst, backend.ProtoTCP)
			if err != nil {
				t.Fatalf("connect s1 to %s: %v", dst, err)
			}
			switch {
			case got == backend.ReasonNone:
			case expiredReason(a == "127.0.0.4", got):
				// Expired at the edge: a kernel backend converts the
				// deadline to its clock a moment early, never late.
				late = true
			default:
				t.Fatalf("connect s1 to %s before its deadline: %s, want allowed", dst, got)
			}
		}
		if late || time.Now().After(soon) {
			if attempt == 3 {
				t.Fatalf("the uses before the deadline did not end before it in four attempts (last margin %v, ended %v after it)", margin, -time.Until(soon))
			}
			t.Logf("attempt %d: the uses before the deadline did not end before it (margin %v); again with twice the margin", attempt, margin)
			margin *= 2
			continue
		}
		time.Sleep(time.Until(soon) + 150*time.Millisecond)
		for _, a := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
			dst := netip.AddrPortFrom(netip.MustParseAddr(a), uint16(port))
			got, err := u.Connect("s1", dst, backend.ProtoTCP)
			if err != nil {
				t.Fatalf("connect s1 to %s: %v", dst, err)
			}
			if !expiredReason(a == "127.0.0.4", got) {
				t.Fatalf("connect s1 to %s after its deadline: %s", dst, got)
			}
		}
		_, err = b.NewHandle(h, never)
		wantErr(t, "a child of an expired handle", err, backend.ErrHandleNotLive)
		return
	}
}

// expiredReason says whether got is what a use past its deadline reads: a
// rule under an expired handle reads handle_expired; a rule past its own
// deadline reads rule_expired, or no_rule once the backend's collector has
// removed it (the dataplane's runs every ExpiryInterval).
func expiredReason(ruleDeadline bool, got backend.Reason) bool {
	if ruleDeadline {
		return got == backend.ReasonRuleExpired || got == backend.ReasonNoRule
	}
	return got == backend.ReasonHandleExpired
}

// testUseNeverList: a never-listed destination is refused whatever the
// grants cover, unless an exception of the session (a NeverOK rule) names
// it under a live handle; the exception dies with its handle.
func testUseNeverList(t *testing.T, s *suite) {
	b, u := s.user(t)
	mustSession(t, b, "s1")
	mustSession(t, b, "s2")
	list := append(append([]backend.NeverEntry{}, backend.DefaultNeverList...),
		backend.NeverEntry{Prefix: prefixOf("127.0.0.9")},
		backend.NeverEntry{Prefix: prefixOf("127.0.0.10"), Port: 40001})
	if err := b.SetNeverList(list); err != nil {
		t.Fatal(err)
	}
	wide := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("0.0.0.0/0", 0, wide)}})
	mustApply(t, b, "s2", backend.Delta{Egress: []backend.EgressRule{egress("0.0.0.0/0", 0, wide)}})
	wantUse(t, u, "s1", "127.0.0.8:40001", backend.ProtoTCP, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNoRule)
	wantUse(t, u, "s1", "127.0.0.10:40001", backend.ProtoTCP, backend.ReasonNoRule)
	wantUse(t, u, "s1", "127.0.0.10:40002", backend.ProtoTCP, backend.ReasonNone)
	// An exception: one address, one port, NeverOK.
	ex := mustHandle(t, b, backend.HandleRef{})
	r := egress("127.0.0.9", 40001, ex)
	r.NeverOK = true
	wide9 := egress("127.0.0.0/24", 0, ex)
	wide9.NeverOK = true
	wantErr(t, "an exception on a prefix", b.Apply("s1", backend.Delta{Egress: []backend.EgressRule{wide9}}), backend.ErrInvalidPrefix)
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{r}})
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.9:40002", backend.ProtoTCP, backend.ReasonNoRule)
	wantUse(t, u, "s2", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNoRule)
	// A second grant names the same exception: revoking one leaves it.
	ex2 := mustHandle(t, b, backend.HandleRef{})
	r2 := r
	r2.Handle = ex2
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{r2}})
	mustRevoke(t, b, ex)
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNone)
	if err := b.Release("s1", ex, backend.Delta{Egress: []backend.EgressRule{r}}); err != nil {
		t.Fatal(err)
	}
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNone)
	mustRevoke(t, b, ex2)
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonHandleRevoked)
	if err := b.Release("s1", ex2, backend.Delta{Egress: []backend.EgressRule{r2}}); err != nil {
		t.Fatal(err)
	}
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNoRule)
	// The list is replaced as a whole.
	if err := b.SetNeverList(backend.DefaultNeverList); err != nil {
		t.Fatal(err)
	}
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNone)
	wantErr(t, "an invalid never-list", b.SetNeverList([]backend.NeverEntry{{}}), backend.ErrInvalidPrefix)
}

// testUseEvents: a denial is reported on the event stream with the
// session, the reason and the destination.
func testUseEvents(t *testing.T, s *suite) {
	b, u := s.user(t)
	s1 := mustSession(t, b, "s1")
	rd, err := b.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	wantUse(t, u, "s1", "127.0.0.2:40001", backend.ProtoTCP, backend.ReasonNoRule)
	rd.SetDeadline(time.Now().Add(5 * time.Second))
	for {
		e, err := rd.Read()
		if err != nil {
			t.Fatalf("no event for the denial: %v", err)
		}
		if e.Session != s1.Index || e.Reason != backend.ReasonNoRule {
			continue
		}
		if want := netip.MustParseAddrPort("127.0.0.2:40001"); e.Dst != want {
			t.Fatalf("event %+v: destination %s, want %s", e, e.Dst, want)
		}
		return
	}
}
