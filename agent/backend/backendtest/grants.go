package backendtest

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// testApply: a Delta lands whole, section by section; an empty one is a
// no-op.
func testApply(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	mustSession(t, b, "s2")
	h := mustHandle(t, b, backend.HandleRef{})
	d := backend.Delta{
		Egress: []backend.EgressRule{
			egress("127.0.0.2", 80, h),
			egress("127.0.0.2", 443, h),
			{Prefix: prefixOf("10.1.0.0/16"), Proto: backend.ProtoTCP, Ports: backend.PortRange{Lo: 8000, Hi: 8999}, Handle: h},
			egress("::1", 0, h),
		},
		Inbound: []backend.EgressRule{inbound("127.0.0.0/24", 8080, h)},
	}
	mustApply(t, b, "s1", d)
	wantDelta(t, b, "s1", d)
	if got := rulesOf(t, b, "s2"); !got.IsEmpty() {
		t.Fatalf("applying to s1 changed s2: %v", got)
	}
	mustApply(t, b, "s1", backend.Delta{})
	wantDelta(t, b, "s1", d)
	// A second grant's Delta adds to the same prefixes.
	h2 := mustHandle(t, b, backend.HandleRef{})
	d2 := backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 80, h2)}}
	mustApply(t, b, "s1", d2)
	wantDelta(t, b, "s1", backend.Delta{Egress: append(append([]backend.EgressRule{}, d.Egress...), d2.Egress...), Inbound: d.Inbound})
}

// testApplyAllOrNothing: a Delta with one bad entry, wherever it fails
// (its shape, its handle, the table), leaves the session exactly as it
// was, entries already there on the same prefixes included.
func testApplyAllOrNothing(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	h0 := mustHandle(t, b, backend.HandleRef{})
	before := backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 1, h0), egress("127.0.0.0/24", 2, h0)}}
	mustApply(t, b, "s1", before)
	h := mustHandle(t, b, backend.HandleRef{})
	dead := mustHandle(t, b, backend.HandleRef{})
	mustRevoke(t, b, dead)
	good := []backend.EgressRule{egress("127.0.0.2", 80, h), egress("127.0.0.3", 80, h), egress("127.0.0.0/24", 80, h)}
	withBad := func(bad backend.EgressRule) backend.Delta {
		return backend.Delta{Egress: append(append([]backend.EgressRule{}, good...), bad)}
	}
	tooMany := []backend.EgressRule{egress("127.0.0.2", 81, h), egress("127.0.0.2", 82, h), egress("127.0.0.2", 83, h)}
	cases := []struct {
		name    string
		session string
		d       backend.Delta
		want    error
	}{
		{"host bits set", "s1", withBad(backend.EgressRule{Prefix: netip.MustParsePrefix("127.0.0.5/24"), Handle: h}), backend.ErrInvalidPrefix},
		{"invalid ports", "s1", withBad(backend.EgressRule{Prefix: prefixOf("127.0.0.5"), Ports: backend.PortRange{Lo: 9, Hi: 1}, Handle: h}), backend.ErrInvalidPorts},
		{"no handle", "s1", withBad(egress("127.0.0.5", 80, backend.HandleRef{})), backend.ErrInvalidHandle},
		{"revoked handle", "s1", withBad(egress("127.0.0.5", 80, dead)), backend.ErrHandleNotLive},
		{"stale generation", "s1", withBad(egress("127.0.0.5", 80, backend.HandleRef{Slot: h.Slot, Generation: h.Generation + 1})), backend.ErrHandleNotLive},
		{"inbound rule in the egress section", "s1", withBad(inbound("127.0.0.5", 80, h)), backend.ErrInvalidPrefix},
		{"egress rule in the inbound section", "s1", backend.Delta{Egress: good, Inbound: []backend.EgressRule{egress("127.0.0.5", 80, h)}}, backend.ErrInvalidPrefix},
		{"fifth rule on one prefix", "s1", backend.Delta{Egress: append(append([]backend.EgressRule{}, good...), append(tooMany, egress("127.0.0.2", 84, h))...)}, backend.ErrRulesFull},
		{"unknown session", "nosuch", backend.Delta{Egress: good}, backend.ErrSessionNotFound},
		// An entry the session holds already, repeated by a failing delta,
		// stays; an entry named twice is refused before anything changes.
		{"an entry already there, then a bad one", "s1", backend.Delta{Egress: []backend.EgressRule{before.Egress[0], egress("127.0.0.5", 80, dead)}}, backend.ErrHandleNotLive},
		{"an entry named twice", "s1", backend.Delta{Egress: append(append([]backend.EgressRule{}, good...), good[0])}, backend.ErrInvalidPrefix},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := b.Apply(tc.session, tc.d)
			wantErr(t, "apply", err, tc.want)
			wantDelta(t, b, "s1", before)
		})
	}
	// With the same entries good, the Delta lands.
	mustApply(t, b, "s1", backend.Delta{Egress: append(append([]backend.EgressRule{}, good...), tooMany[:2]...)})
}

// testAllowEgress: one rule added at a time (the resolver's answers); the
// same entry again refreshes its expiry and never shortens it.
func testAllowEgress(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	h := mustHandle(t, b, backend.HandleRef{})
	r := egress("192.0.2.7", 443, h)
	r.Expires = time.Now().Add(time.Hour)
	if err := b.AllowEgress("s1", r); err != nil {
		t.Fatal(err)
	}
	later := r
	later.Expires = r.Expires.Add(time.Hour)
	earlier := r
	earlier.Expires = r.Expires.Add(-30 * time.Minute)
	for _, x := range []backend.EgressRule{later, earlier} {
		if err := b.AllowEgress("s1", x); err != nil {
			t.Fatal(err)
		}
	}
	got := rulesOf(t, b, "s1").Egress
	if len(got) != 1 || !backend.SameRule(got[0], r) {
		t.Fatalf("after three refreshes of one entry: %v", got)
	}
	if d := got[0].Expires.Sub(later.Expires); d < -time.Second || d > time.Second {
		t.Fatalf("entry expires %v, want the latest refresh's %v", got[0].Expires, later.Expires)
	}
	wantErr(t, "allow under no handle", b.AllowEgress("s1", egress("192.0.2.8", 443, backend.HandleRef{})), backend.ErrInvalidHandle)
	wantErr(t, "allow in no session", b.AllowEgress("nosuch", egress("192.0.2.8", 443, h)), backend.ErrSessionNotFound)
	mustRevoke(t, b, h)
	wantErr(t, "allow under a revoked handle", b.AllowEgress("s1", egress("192.0.2.8", 443, h)), backend.ErrHandleNotLive)
}

// testRelease: Release reclaims a dead grant's entries and slot, is
// tolerant of what is gone already, and refuses a live handle.
func testRelease(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	h := mustHandle(t, b, backend.HandleRef{})
	d := backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 80, h), egress("127.0.0.0/24", 0, h)}, Inbound: []backend.EgressRule{inbound("127.0.0.0/24", 8080, h)}}
	mustApply(t, b, "s1", d)

	err := b.Release("s1", h, backend.Delta{})
	wantErr(t, "release a live handle", err, backend.ErrHandleLive)
	wantState(t, b, h, backend.HandleLive)
	wantDelta(t, b, "s1", d)
	// Refused before anything is removed.
	err = b.Release("s1", h, d)
	wantErr(t, "release a live handle's delta", err, backend.ErrHandleLive)
	wantDelta(t, b, "s1", d)

	ops := opsDelta(b, func() { mustRevoke(t, b, h) })
	if err := b.Release("s1", h, d); err != nil {
		t.Fatalf("release a revoked handle: %v", err)
	}
	if got := rulesOf(t, b, "s1"); !got.IsEmpty() {
		t.Fatalf("entries left after release: %v", got)
	}
	wantState(t, b, h, backend.HandleFree)
	if _, ok := handleIn(snapshot(t, b), h); ok {
		t.Fatalf("released handle %s still in the snapshot", h)
	}
	if after := opsDelta(b, func() {
		if err := b.Release("s1", h, d); err != nil {
			t.Fatalf("release again: %v", err)
		}
	}); after.RevokeWrites != 0 || after.Sweeps != 0 || ops.RevokeWrites != 1 {
		t.Fatalf("revoke cost %+v, a second release %+v; want one write, then nothing", ops, after)
	}

	// Entries alone (ref zero), under a live handle: reconcile's orphans.
	h2 := mustHandle(t, b, backend.HandleRef{})
	r2 := egress("127.0.0.9", 80, h2)
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{r2}})
	if err := b.Release("s1", backend.HandleRef{}, backend.Delta{Egress: []backend.EgressRule{r2}}); err != nil {
		t.Fatalf("release entries alone: %v", err)
	}
	if got := rulesOf(t, b, "s1"); !got.IsEmpty() {
		t.Fatalf("entries left: %v", got)
	}
	wantState(t, b, h2, backend.HandleLive)

	// A slot alone, without a session (reconcile's orphan handles).
	mustRevoke(t, b, h2)
	if err := b.Release("", h2, backend.Delta{}); err != nil {
		t.Fatalf("release a slot alone: %v", err)
	}
	wantState(t, b, h2, backend.HandleFree)

	// The session gone already.
	h3 := mustHandle(t, b, backend.HandleRef{})
	mustSession(t, b, "s2")
	d3 := backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.3", 80, h3)}}
	mustApply(t, b, "s2", d3)
	mustRevoke(t, b, h3)
	if err := b.DestroySession("s2"); err != nil {
		t.Fatal(err)
	}
	if err := b.Release("s2", h3, d3); err != nil {
		t.Fatalf("release in a destroyed session: %v", err)
	}
	wantState(t, b, h3, backend.HandleFree)

	// A live child whose ancestor is revoked is dead: it may be released.
	p := mustHandle(t, b, backend.HandleRef{})
	c := mustHandle(t, b, p)
	mustRevoke(t, b, p)
	if err := b.Release("", c, backend.Delta{}); err != nil {
		t.Fatalf("release a child of a revoked parent: %v", err)
	}
	wantState(t, b, c, backend.HandleFree)
}

// testRevoke: one write per live handle, none for a dead one; a reference
// that cannot exist is refused.
func testRevoke(t *testing.T, s *suite) {
	b := s.backend(t)
	h := mustHandle(t, b, backend.HandleRef{})
	ops := opsDelta(b, func() { mustRevoke(t, b, h) })
	if ops.RevokeWrites != 1 || ops.Sweeps > 1 {
		t.Fatalf("revoke cost %+v, want one write and at most one sweep", ops)
	}
	wantState(t, b, h, backend.HandleRevoked)
	if ops := opsDelta(b, func() { mustRevoke(t, b, h) }); ops != (backend.Ops{}) {
		t.Fatalf("revoking a revoked handle cost %+v, want nothing", ops)
	}
	wantErr(t, "revoke the zero reference", b.Revoke(backend.HandleRef{}), backend.ErrInvalidHandle)
	_, err := b.NewHandle(h, never)
	wantErr(t, "a child of a revoked handle", err, backend.ErrHandleNotLive)
	if _, err := b.NewHandle(backend.HandleRef{Slot: h.Slot, Generation: h.Generation + 7}, never); !errors.Is(err, backend.ErrHandleNotLive) {
		t.Fatalf("a child of a reference never issued: %v, want ErrHandleNotLive", err)
	}
}

// testMembrane: revoking a parent is one write that kills the whole
// subtree: descendants keep their own state words (live), yet nothing can
// be issued or applied under them, and their releases are allowed.
func testMembrane(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	mustSession(t, b, "sub")
	root := mustHandle(t, b, backend.HandleRef{})
	c1 := mustHandle(t, b, root)
	c2 := mustHandle(t, b, root)
	g := mustHandle(t, b, c1)
	gg := mustHandle(t, b, g)
	other := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.0/24", 0, root)}})
	mustApply(t, b, "sub", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 80, c1), egress("127.0.0.3", 80, c2), egress("127.0.0.2", 81, gg)}})
	snap := snapshot(t, b)
	for child, parent := range map[backend.HandleRef]backend.HandleRef{c1: root, c2: root, g: c1, gg: g, root: {}} {
		row, ok := handleIn(snap, child)
		if !ok || row.Parent != parent || row.State != backend.HandleLive {
			t.Fatalf("snapshot row of %s: %+v (found %v), want live with parent %s", child, row, ok, parent)
		}
	}
	ops := opsDelta(b, func() { mustRevoke(t, b, root) })
	if ops.RevokeWrites != 1 || ops.Sweeps > 1 {
		t.Fatalf("revoking a parent of four cost %+v, want one write and at most one sweep", ops)
	}
	wantState(t, b, root, backend.HandleRevoked)
	for _, h := range []backend.HandleRef{c1, c2, g, gg} {
		// One write: the descendants' own words are untouched; the
		// parent walk kills them.
		wantState(t, b, h, backend.HandleLive)
		_, err := b.NewHandle(h, never)
		wantErr(t, "a child under the revoked subtree", err, backend.ErrHandleNotLive)
		wantErr(t, "an entry under the revoked subtree", b.AllowEgress("sub", egress("127.0.0.7", 80, h)), backend.ErrHandleNotLive)
	}
	wantState(t, b, other, backend.HandleLive)
	if _, err := b.NewHandle(other, never); err != nil {
		t.Fatalf("a handle outside the subtree: %v", err)
	}
	// Reclaiming the subtree, leaves first: no further write or sweep.
	ops = opsDelta(b, func() {
		for _, x := range []struct {
			ref     backend.HandleRef
			session string
			d       backend.Delta
		}{
			{gg, "sub", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 81, gg)}}},
			{g, "sub", backend.Delta{}},
			{c2, "sub", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.3", 80, c2)}}},
			{c1, "sub", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 80, c1)}}},
			{root, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.0/24", 0, root)}}},
		} {
			if err := b.Release(x.session, x.ref, x.d); err != nil {
				t.Fatalf("release %s: %v", x.ref, err)
			}
		}
	})
	if ops != (backend.Ops{}) {
		t.Fatalf("releasing the subtree cost %+v, want no write and no sweep", ops)
	}
	snap = snapshot(t, b)
	for _, h := range []backend.HandleRef{root, c1, c2, g, gg} {
		if row, ok := handleIn(snap, h); ok {
			t.Fatalf("handle %+v still listed after the subtree was released", row)
		}
	}
	if _, ok := handleIn(snap, other); !ok {
		t.Fatalf("handle %s outside the subtree is gone", other)
	}
	if len(snap.Deltas) != 0 {
		t.Fatalf("entries after the subtree was released: %v", snap.Deltas)
	}
}

// testChainBound: attenuation chains are bounded; the bound is refused
// with ErrChainTooDeep and leaves no handle; the chain's root still kills
// the deepest link.
func testChainBound(t *testing.T, s *suite) {
	b := s.backend(t)
	root := mustHandle(t, b, backend.HandleRef{})
	chain := []backend.HandleRef{root}
	var err error
	for len(chain) < 64 {
		var h backend.HandleRef
		if h, err = b.NewHandle(chain[len(chain)-1], never); err != nil {
			break
		}
		chain = append(chain, h)
	}
	wantErr(t, "the 64th link of a chain", err, backend.ErrChainTooDeep)
	t.Logf("chains hold at most %d handles", len(chain))
	if n := len(snapshot(t, b).Handles); n != len(chain) {
		t.Fatalf("%d handles after the refused link, want %d", n, len(chain))
	}
	mustRevoke(t, b, root)
	_, err = b.NewHandle(chain[len(chain)-2], never)
	wantErr(t, "a link under the revoked root", err, backend.ErrHandleNotLive)
}

// testGenerations: a freed slot handed out again never revives a reference
// to its old handle.
func testGenerations(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	old := mustHandle(t, b, backend.HandleRef{})
	mustRevoke(t, b, old)
	if err := b.Release("", old, backend.Delta{}); err != nil {
		t.Fatal(err)
	}
	var fresh backend.HandleRef
	for i := 0; i < 64; i++ {
		if h := mustHandle(t, b, backend.HandleRef{}); h.Slot == old.Slot {
			fresh = h
			break
		}
	}
	if fresh.IsZero() {
		t.Skipf("%T did not hand slot %d out again in 64 issues: no recycled slot to check", b, old.Slot)
	}
	if fresh.Generation == old.Generation {
		t.Fatalf("slot %d handed out again at the same generation: %s and %s", old.Slot, old, fresh)
	}
	wantState(t, b, old, backend.HandleFree)
	wantState(t, b, fresh, backend.HandleLive)
	// Everything naming the old reference is harmless to the new handle.
	ops := opsDelta(b, func() { mustRevoke(t, b, old) })
	if ops != (backend.Ops{}) {
		t.Fatalf("revoking the stale reference cost %+v", ops)
	}
	if err := b.Release("s1", old, backend.Delta{}); err != nil {
		t.Fatalf("releasing the stale reference: %v", err)
	}
	wantState(t, b, fresh, backend.HandleLive)
	_, err := b.NewHandle(old, never)
	wantErr(t, "a child of the stale reference", err, backend.ErrHandleNotLive)
	wantErr(t, "an entry under the stale reference", b.AllowEgress("s1", egress("127.0.0.2", 80, old)), backend.ErrHandleNotLive)
	if _, ok := handleIn(snapshot(t, b), old); ok {
		t.Fatalf("the snapshot lists the stale reference %s", old)
	}
}

// testApproveOnce: an approve-once handle reads once until a use consumes
// it (see UseOnce); Apply does not consume it; it has a subtree like any
// handle. A backend that cannot consume at use time refuses to issue one.
func testApproveOnce(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	o, err := b.NewOnceHandle(backend.HandleRef{}, never)
	if errors.Is(err, backend.ErrNotSupported) {
		t.Skipf("%T issues no approve-once handles: %v", b, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, b, o, backend.HandleOnce)
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 80, o)}})
	wantState(t, b, o, backend.HandleOnce)
	if row, ok := handleIn(snapshot(t, b), o); !ok || row.State != backend.HandleOnce {
		t.Fatalf("snapshot row of the once handle: %+v (found %v)", row, ok)
	}
	p := mustHandle(t, b, backend.HandleRef{})
	co, err := b.NewOnceHandle(p, never)
	if err != nil {
		t.Fatalf("a once child: %v", err)
	}
	mustRevoke(t, b, p)
	wantState(t, b, co, backend.HandleOnce)
	wantErr(t, "an entry under a once child of a revoked parent", b.AllowEgress("s1", egress("127.0.0.3", 80, co)), backend.ErrHandleNotLive)
	ops := opsDelta(b, func() { mustRevoke(t, b, o) })
	if ops.RevokeWrites != 1 {
		t.Fatalf("revoking a once handle cost %+v", ops)
	}
	wantState(t, b, o, backend.HandleRevoked)
}
