package agent

// Tests of approvals and the breaker, on the memory backend (no root, any
// GOOS): Asks across a restart, the denial circuit breaker, cross-session
// delegation at Ask tier.

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestApprovalsSurviveRestart: an Ask waits for a human across a restart;
// approval runs the GRANT sequence; a timed-out approval does not run.
func TestApprovalsSurviveRestart(t *testing.T) {
	d := memKernel(t)
	dir := t.TempDir()
	now := time.Now()
	clock := func() time.Time { return now }
	a := openAgent(t, d, dir, func(c *Config) { c.Now = clock })
	mustSession(t, a, SessionSpec{ID: "s1"})
	const target = "127.0.1.7:8080"
	_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(target), Lifecycle: LifecycleSession, Requester: "agent-7"})
	var are *ApprovalRequiredError
	if !errors.As(err, &are) || are.Tier != TierAsk {
		t.Fatalf("want an approval, got %v", err)
	}
	_, err = a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress("127.0.1.8:80"), Lifecycle: LifecycleSession})
	var stale *ApprovalRequiredError
	if !errors.As(err, &stale) {
		t.Fatal(err)
	}
	// Restart.
	a = openAgent(t, d, dir, func(c *Config) { c.Now = clock })
	if n := len(a.PendingApprovals()); n != 2 {
		t.Fatalf("pending after restart = %d", n)
	}
	if _, err := a.Approve(ctx, are.ID, ""); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("approval without approver: %v", err)
	}
	g, err := a.Approve(ctx, are.ID, "alice")
	if err != nil {
		t.Fatal(err)
	}
	wantDenied(t, d, "s1", "127.0.1.8:80")
	wantAllowed(t, d, "s1", target) // after approval
	if _, err := a.Approve(ctx, are.ID, "alice"); !errors.Is(err, ErrUnknownApproval) {
		t.Fatalf("approve twice: %v", err)
	}
	now = now.Add(DefaultApprovalTimeout + time.Second)
	if _, err := a.Approve(ctx, stale.ID, "alice"); !errors.Is(err, ErrApprovalExpired) {
		t.Fatalf("stale approval: %v", err)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
}

// TestBreaker: 3 consecutive denials escalate an attended session (every
// later grant asks a human) and terminate a headless one.
func TestBreaker(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "att"})
	mustSession(t, a, SessionSpec{ID: "headless", Headless: true})
	deny := UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("198.51.100.1"), Port: 443}
	for i := 0; i < 3; i++ {
		if dec, err := a.Decide("att", deny); err != nil || dec.Allowed {
			t.Fatalf("decide: %+v %v", dec, err)
		}
	}
	b, _ := a.Breaker("att")
	if !b.Tripped || b.Consecutive != 3 {
		t.Fatalf("breaker = %+v", b)
	}
	const x = "127.0.0.2:8080"
	if _, err := a.Grant(ctx, GrantRequest{Session: "att", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrApprovalRequired) {
		t.Fatalf("auto grant on an escalated session: %v", err)
	}
	if err := a.ResetBreaker("att", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "att", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
		t.Fatalf("grant after reset: %v", err)
	}
	// An allowed decision resets the consecutive count.
	a.Decide("att", deny)
	a.Decide("att", deny)
	ap := netip.MustParseAddrPort(x)
	a.Decide("att", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()})
	a.Decide("att", deny)
	if b, _ := a.Breaker("att"); b.Tripped || b.Consecutive != 1 || b.Total != 3 {
		t.Fatalf("breaker after an allow = %+v", b)
	}
	// Headless: terminated.
	if _, err := a.Grant(ctx, GrantRequest{Session: "headless", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		a.Decide("headless", deny)
	}
	if _, err := a.Breaker("headless"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("headless session not terminated: %v", err)
	}
	if _, err := d.Session("headless"); !errors.Is(err, backend.ErrSessionNotFound) {
		t.Fatalf("headless backend session still there: %v", err)
	}
	// Total threshold, configurable.
	a2 := openAgent(t, d, t.TempDir(), func(c *Config) { c.Breaker = BreakerConfig{Consecutive: 100, Total: 4} })
	mustSession(t, a2, SessionSpec{ID: "tot"})
	for i := 0; i < 4; i++ {
		a2.Decide("tot", deny)
	}
	if b, _ := a2.Breaker("tot"); !b.Tripped {
		t.Fatalf("total threshold: %+v", b)
	}
}

// TestCrossSessionAttenuationAsks: delegating to another session at Ask tier
// waits for a human; the pending approval never holds the parent's token.
func TestCrossSessionAttenuationAsks(t *testing.T) {
	d := memKernel(t)
	dir := t.TempDir()
	a := openAgent(t, d, dir)
	mustSession(t, a, SessionSpec{ID: "s1"})
	mustSession(t, a, SessionSpec{ID: "sub"})
	c := loopEgress("127.0.1.9:80")
	_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: c, Lifecycle: LifecycleSession})
	var are *ApprovalRequiredError
	if !errors.As(err, &are) {
		t.Fatal(err)
	}
	pg, err := a.Approve(ctx, are.ID, "alice")
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Attenuate(ctx, pg.Handle, GrantRequest{Session: "sub", Capability: c, Lifecycle: LifecycleSession})
	if !errors.As(err, &are) {
		t.Fatalf("cross-session delegation at Ask tier: %v", err)
	}
	for _, ap := range a.PendingApprovals() {
		if ap.Request.Parent != "" {
			t.Fatal("a pending approval holds a handle token")
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "state.*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no state files: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), pg.Handle) {
			t.Fatalf("%s holds a handle token", f)
		}
	}
	cg, err := a.Approve(ctx, are.ID, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if cg.Parent == "" || cg.Session != "sub" {
		t.Fatalf("child grant %+v", cg)
	}
	if err := a.Revoke(ctx, pg.Handle); err != nil {
		t.Fatal(err)
	}
	if err := a.Consume(ctx, cg.Handle); !errors.Is(err, ErrHandleRevoked) {
		t.Fatalf("child after parent revoke: %v", err)
	}
}
