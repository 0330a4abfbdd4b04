package agent

// Lifecycle tests on the memory backend (no root, any GOOS): what no host
// enforces is refused; tombstones are pruned. The kernel's once, expiry and
// session-end tests are lifecycle_linux_test.go.

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestTLSInspectionRefused: nothing inspects TLS on this host, so neither a
// session nor a grant may ask for it (not enforceable, never a silent flag).
func TestTLSInspectionRefused(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir())
	if err := a.CreateSession(SessionSpec{ID: "tls1", TLSInspection: true}); !errors.Is(err, ErrNotEnforceable) || !strings.Contains(err.Error(), "not enforceable on this host") {
		t.Fatalf("session with tls_inspection: %v", err)
	}
	mustSession(t, a, SessionSpec{ID: "s1"})
	c := loopEgress("127.0.0.2:443")
	c.Egress.TLSInspect = true
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: c, Lifecycle: LifecycleSession}); !errors.Is(err, ErrNotEnforceable) {
		t.Fatalf("grant with tls_inspect: %v", err)
	}
}

// TestTombstonePruning: revoked records are pruned after the retention; the
// pruned grant's token still revokes idempotently and cannot be used.
func TestTombstonePruning(t *testing.T) {
	d := memKernel(t)
	now := time.Now()
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Now = func() time.Time { return now } })
	mustSession(t, a, SessionSpec{ID: "s1"})
	const x = "127.0.0.2:8080"
	g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	now = now.Add(23 * time.Hour)
	a.Sweep(ctx)
	if n := len(a.Grants("")); n != 1 {
		t.Fatalf("pruned too early: %d records", n)
	}
	now = now.Add(2 * time.Hour)
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(a.Grants("")); n != 0 {
		t.Fatalf("not pruned: %d records", n)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatalf("revoke a pruned grant: %v", err)
	}
	if err := a.Consume(ctx, g.Handle); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("use a pruned grant: %v", err)
	}
	if _, err := a.Attenuate(ctx, g.Handle, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("attenuate a pruned grant: %v", err)
	}
}
