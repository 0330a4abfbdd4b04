package dataplane

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// neverProbe reads a dataplane's never-list exceptions for one session.
type neverProbe struct {
	t    *testing.T
	d    *Dataplane
	sess string
	idx  uint32
}

// exception is a NeverOK rule for addr:port under h.
func exception(addr string, port uint16, h HandleRef) EgressRule {
	return EgressRule{Prefix: pfx(addr + "/32"), Ports: Port(port), Handle: h, NeverOK: true}
}

// points returns the handle r's exception entry points at, if it has one.
func (p neverProbe) points(r EgressRule) (HandleRef, bool) {
	var v shkShkNeverOk
	if err := p.d.objs.ShkNeverOks.Lookup(neverOKKey(p.idx, r), &v); err != nil {
		return HandleRef{}, false
	}
	return HandleRef{Slot: v.Handle, Generation: v.Generation}, true
}

func (p neverProbe) wantPoints(r EgressRule, want HandleRef, what string) {
	p.t.Helper()
	if got, ok := p.points(r); !ok || got != want {
		p.t.Fatalf("%s: the exception for %s points at %v (present %v), want %v", what, r.Prefix, got, ok, want)
	}
}

func (p neverProbe) evals() int {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	return p.d.never.evals
}

// revoke revokes h and returns how many exception entries the revoke
// evaluated.
func (p neverProbe) revoke(h HandleRef) int {
	p.t.Helper()
	n := p.evals()
	if err := p.d.Revoke(h); err != nil {
		p.t.Fatal(err)
	}
	return p.evals() - n
}

// TestNeverRepointOnlyAffected: a revoke re-points only the shared
// never-list exceptions that the revoked handle or one of its descendants
// names, and each still points at the best handle standing (live before
// approve-once, then the first named); an exception one handle names alone
// stays until its release; a session's end empties the index.
func TestNeverRepointOnlyAffected(t *testing.T) {
	d := newDataplane(t, modeConfig(t, flowModes(t)[0]))
	s, err := d.CreateSession("nvi", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	p := neverProbe{t: t, d: d, sess: "nvi", idx: s.Index}
	ln := listenTCP(t, "127.0.0.7:0")
	port := netip.MustParseAddrPort(ln.addr()).Port()
	if err := d.SetNeverList(append(DefaultNeverList(), NeverEntry{Prefix: pfx("127.0.0.7/32"), Port: port})); err != nil {
		t.Fatal(err)
	}
	grant := func(parent HandleRef, addr string) (HandleRef, EgressRule) {
		h := mustHandle(t, d, parent, time.Time{})
		r := exception(addr, port, h)
		mustAllow(t, d, "nvi", r)
		return h, r
	}

	// 20 exceptions, each shared by two grants
	const n = 20
	var as, bs []HandleRef
	var rs []EgressRule
	for i := range n {
		a, r := grant(HandleRef{}, fmt.Sprintf("127.0.9.%d", i+1))
		b, _ := grant(HandleRef{}, fmt.Sprintf("127.0.9.%d", i+1))
		as, bs, rs = append(as, a), append(bs, b), append(rs, r)
	}
	if got := p.revoke(as[5]); got != 1 {
		t.Fatalf("revoking one of %d shared exceptions' grants evaluated %d entries, want 1", n, got)
	}
	p.wantPoints(rs[5], bs[5], "its first grant revoked")
	for i := range n {
		if i != 5 {
			p.wantPoints(rs[i], as[i], "another exception's grant revoked")
		}
	}

	// named by one grant: nothing to re-point; the entry stays until release
	z, rz := grant(HandleRef{}, "127.0.9.100")
	if got := p.revoke(z); got != 0 {
		t.Fatalf("revoking the one grant naming an exception evaluated %d entries, want 0", got)
	}
	p.wantPoints(rz, z, "its only grant revoked, not released")

	// a descendant dies with its parent: the exception moves to the other
	// grant, and the kernel honours it
	parent := mustHandle(t, d, HandleRef{}, time.Time{})
	child, rc := grant(parent, "127.0.0.7")
	other, _ := grant(HandleRef{}, "127.0.0.7")
	p.wantPoints(rc, child, "two live grants")
	pr := startProbe(t, s, ProcOptions{})
	if got := pr.Do("tcp " + ln.addr()); got != "ok" {
		t.Fatalf("never-listed destination under two exceptions: %s", got)
	}
	if got := p.revoke(parent); got != 1 {
		t.Fatalf("revoking the parent of one exception's grant evaluated %d entries, want 1", got)
	}
	p.wantPoints(rc, other, "the first grant's parent revoked")
	if got := pr.Do("tcp " + ln.addr()); got != "ok" {
		t.Fatalf("never-listed destination, first grant's parent revoked, second live: %s", got)
	}

	// best handle: live before approve-once, whatever the naming order
	x, rb := grant(HandleRef{}, "127.0.9.200")
	once, err := d.NewOnceHandle(HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	mustAllow(t, d, "nvi", exception("127.0.9.200", port, once))
	y, _ := grant(HandleRef{}, "127.0.9.200")
	p.wantPoints(rb, x, "live, approve-once, live")
	if got := p.revoke(x); got != 1 {
		t.Fatalf("revoke evaluated %d entries, want 1", got)
	}
	p.wantPoints(rb, y, "first live grant revoked")
	p.revoke(y)
	p.wantPoints(rb, once, "both live grants revoked")
	p.revoke(once)
	p.wantPoints(rb, x, "all three revoked (the first named)")
	for _, h := range []HandleRef{x, once, y} {
		if err := d.Release("nvi", h, Delta{Egress: []EgressRule{exception("127.0.9.200", port, h)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := p.points(rb); ok {
		t.Fatal("the exception outlived the release of its last grant")
	}
	d.mu.Lock()
	_, indexed := d.never.handles[x]
	_, below := d.never.below[y]
	d.mu.Unlock()
	if indexed || below {
		t.Fatalf("released handles still indexed: %v %v", indexed, below)
	}

	if err := d.DestroySession("nvi"); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.neverRefs) != 0 || len(d.never.handles) != 0 || len(d.never.below) != 0 {
		t.Fatalf("after the session's end: %d exceptions, %d handles, %d subtrees indexed", len(d.neverRefs), len(d.never.handles), len(d.never.below))
	}
}

// TestNeverIndexAdopted: a dataplane that adopts pinned maps rebuilds the
// handle index from the egress entries, so its revokes re-point only the
// affected exceptions too, descendants included.
func TestNeverIndexAdopted(t *testing.T) {
	d, reopen := openAdoptable(t)
	s, err := d.CreateSession("nva", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	parent := mustHandle(t, d, HandleRef{}, time.Time{})
	child := mustHandle(t, d, parent, time.Time{})
	var rs []EgressRule
	var others []HandleRef
	for i := range 5 {
		addr := fmt.Sprintf("127.0.10.%d", i+1)
		a, b := child, mustHandle(t, d, HandleRef{}, time.Time{})
		if i > 0 {
			a = mustHandle(t, d, HandleRef{}, time.Time{})
		}
		mustAllow(t, d, "nva", exception(addr, 443, a))
		mustAllow(t, d, "nva", exception(addr, 443, b))
		rs, others = append(rs, exception(addr, 443, a)), append(others, b)
	}
	d = reopen(d)
	p := neverProbe{t: t, d: d, sess: "nva", idx: s.Index}
	p.wantPoints(rs[0], child, "adopted")
	if got := p.revoke(parent); got != 1 {
		t.Fatalf("adopted: revoking the parent of one exception's grant evaluated %d entries, want 1", got)
	}
	p.wantPoints(rs[0], others[0], "adopted, the first grant's parent revoked")
	p.wantPoints(rs[1], rs[1].Handle, "adopted, another exception")
}

// openAdoptable opens a dataplane (the first flow mode's config) for a test
// that reopens it: reopen closes the one given and opens again, which must
// adopt; the test's cleanup uninstalls the last one opened.
func openAdoptable(t *testing.T) (*Dataplane, func(*Dataplane) *Dataplane) {
	kerneltest.RequireRoot(t)
	cfg := modeConfig(t, flowModes(t)[0])
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cur := d
	t.Cleanup(func() {
		if err := cur.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	reopen := func(old *Dataplane) *Dataplane {
		t.Helper()
		if err := old.Close(); err != nil {
			t.Fatal(err)
		}
		d, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cur = d
		if !d.Adopted() {
			t.Fatal("the second Open did not adopt")
		}
		return d
	}
	return d, reopen
}
