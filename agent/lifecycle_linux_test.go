package agent

// Tier-3 tests of handle lifecycles in the kernel, as root: once grants
// consumed by a real connect, expiry on the kernel's clock, session end.
// Their memory twins are TestMemoryOnceAndExpiry and TestMemoryEndSession.

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

// TestOnceAndExpiry: a once grant dies at its use; an expired grant is
// denied by the kernel and swept.
func TestOnceAndExpiry(t *testing.T) {
	d, _ := newKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	y := listenTCP(t, "127.0.0.3:0")
	once, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleOnce})
	if err != nil {
		t.Fatal(err)
	}
	if once.Expires.IsZero() || once.Expires.After(time.Now().Add(DefaultOnceTTL+time.Second)) {
		t.Fatalf("once grant expiry %v", once.Expires)
	}
	short, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(y), Lifecycle: LifecycleSession, TTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := startProbe(t, d, "s1")
	if got := p.DoAsync("tcp " + x); got != "ok" {
		t.Fatalf("once before use: %s", got)
	}
	if err := a.Consume(ctx, once.Handle); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + x); got != "err EPERM" {
		t.Fatalf("once after use: %s", got)
	}
	if got := p.DoAsync("tcp " + y); got != "ok" {
		t.Fatalf("ttl grant before expiry: %s", got)
	}
	time.Sleep(1600 * time.Millisecond)
	if got := p.DoAsync("tcp " + y); got != "err EPERM" {
		t.Fatalf("ttl grant after expiry (kernel): %s", got)
	}
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Consume(ctx, short.Handle); !errors.Is(err, ErrHandleRevoked) {
		t.Fatalf("expired handle: %v", err)
	}
	if n := len(liveHandles(t, d)); n != 0 {
		t.Fatalf("live handles after sweep: %d", n)
	}
}

// TestOnceInKernel: an approve-once grant is consumed by its first connect
// in the kernel, with no Consume call and no agent round trip: the second
// connect gets EPERM, from a second process too.
func TestOnceInKernel(t *testing.T) {
	d, _ := newKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	once, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleOnce})
	if err != nil {
		t.Fatal(err)
	}
	p, q := startProbe(t, d, "s1"), startProbe(t, d, "s1")
	if got := p.DoAsync("tcp " + x); got != "ok" {
		t.Fatalf("first use: %s", got)
	}
	if got := p.DoAsync("tcp " + x); got != "err EPERM" {
		t.Fatalf("second connect, same process: %s", got)
	}
	if got := q.DoAsync("tcp " + x); got != "err EPERM" {
		t.Fatalf("second connect, another process: %s", got)
	}
	// reporting the use afterwards is still accepted (it revokes the grant)
	if err := a.Consume(ctx, once.Handle); err != nil {
		t.Fatal(err)
	}
}

// TestOnceDecideConsumed: the use-time answer follows the kernel: before
// the first connect an approve-once grant allows, after the kernel consumed
// it DecideUse denies with ConsumedOnce and the grants listing shows it
// consumed; a destination another (session) grant covers stays allowed.
func TestOnceDecideConsumed(t *testing.T) {
	d, _ := newKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1"})
	x := listenTCP(t, "127.0.0.2:0")
	y := listenTCP(t, "127.0.0.3:0")
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleOnce}); err != nil {
		t.Fatal(err)
	}
	// y: an approve-once grant and a session grant both cover it
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(y), Lifecycle: LifecycleOnce}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(y), Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	use := func(hp string) UseRequest {
		ap := netip.MustParseAddrPort(hp)
		return UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()}
	}
	consumed := func() (n int) {
		for _, g := range a.Grants("s1") {
			if g.Consumed {
				n++
			}
		}
		return n
	}
	if ud, err := a.DecideUse("s1", use(x)); err != nil || !ud.Allowed {
		t.Fatalf("before the first use: %+v, %v", ud, err)
	}
	if n := consumed(); n != 0 {
		t.Fatalf("before any use: %d grants listed consumed", n)
	}
	p := startProbe(t, d, "s1")
	if got := p.DoAsync("tcp " + x); got != "ok" {
		t.Fatalf("first use: %s", got)
	}
	ud, err := a.DecideUse("s1", use(x))
	if err != nil || ud.Allowed || ud.DecidedBy != ConsumedOnce {
		t.Fatalf("after the kernel consumed it: %+v, %v; want denied by %q", ud, err, ConsumedOnce)
	}
	if got := p.DoAsync("tcp " + x); got != "err EPERM" {
		t.Fatalf("second connect: %s", got)
	}
	if n := consumed(); n != 1 {
		t.Fatalf("after the first use: %d grants listed consumed, want 1", n)
	}
	if ud, err := a.DecideUse("s1", use(y)); err != nil || !ud.Allowed {
		t.Fatalf("a destination a session grant covers too: %+v, %v", ud, err)
	}
}

// TestEndSession: ending a session revokes its grants, including grants
// attenuated from them in other sessions, and removes its cgroup.
func TestEndSession(t *testing.T) {
	d, _ := newKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1"})
	mustSession(t, a, SessionSpec{ID: "sub"})
	x := listenTCP(t, "127.0.0.2:0")
	g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Attenuate(ctx, g.Handle, GrantRequest{Session: "sub", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	p := startProbe(t, d, "sub")
	if got := p.DoAsync("tcp " + x); got != "ok" {
		t.Fatalf("sub before: %s", got)
	}
	if err := a.EndSession("s1"); err != nil {
		t.Fatal(err)
	}
	if got := p.DoAsync("tcp " + x); got != "err EPERM" {
		t.Fatalf("sub after the parent session ended: %s", got)
	}
	if err := a.EndSession("s1"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("end twice: %v", err)
	}
	if err := a.CreateSession(SessionSpec{ID: "../x", Image: "py"}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("bad session id: %v", err)
	}
	if err := a.CreateSession(SessionSpec{ID: "sub", Image: "py"}); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("duplicate session: %v", err)
	}
}
