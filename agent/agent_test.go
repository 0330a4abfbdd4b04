package agent

// The agent's gate on the memory backend (no root, any GOOS): refusals,
// manifest reloads, concurrent use, the two-of-three gate, the policy
// store. The kernel end-to-end tests are agent_linux_test.go.

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// TestGrantRefusals: every refusal of the gate leaves state and kernel as
// they were.
func TestGrantRefusals(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Breaker = BreakerConfig{Consecutive: 100, Total: 100} })
	mustSession(t, a, SessionSpec{ID: "s1", Workspace: "/work"})
	low := SessionSpec{ID: "low", TrustTier: "low"}
	mustSession(t, a, low)
	high := SessionSpec{ID: "high", Risk: "high"}
	mustSession(t, a, high)
	const x = "127.0.0.2:8080"
	cases := []struct {
		name string
		req  GrantRequest
		want error
	}{
		{"outside manifest", GrantRequest{Session: "s1", Capability: loopEgress("10.0.0.1:80"), Lifecycle: LifecycleSession}, ErrOutsideManifest},
		{"undeclared class", GrantRequest{Session: "s1", Capability: Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "compute"}}, Lifecycle: LifecycleSession}, ErrOutsideManifest},
		{"block tier (credentials)", GrantRequest{Session: "s1", Capability: Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"github:read"}, NeverRaw: true}}, Lifecycle: LifecycleSession}, ErrBlockTier},
		{"never_raw false", GrantRequest{Session: "s1", Capability: Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"github:read"}}}, Lifecycle: LifecycleSession}, ErrInvalidCapability},
		{"not enforceable (clipboard)", GrantRequest{Session: "s1", Capability: Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, Lifecycle: LifecycleSession}, ErrNotEnforceable},
		{"standing in session", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleStanding}, ErrStandingInSession},
		{"bad lifecycle", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: "forever"}, ErrInvalidRequest},
		{"empty capability", GrantRequest{Session: "s1", Capability: Empty(ClassNetEgress), Lifecycle: LifecycleSession}, ErrInvalidRequest},
		{"unknown session", GrantRequest{Session: "nope", Capability: loopEgress(x), Lifecycle: LifecycleSession}, ErrUnknownSession},
		{"external ask → block", GrantRequest{Session: "s1", Capability: loopEgress("127.0.1.1:80"), Lifecycle: LifecycleSession, Provenance: External}, ErrBlockTier},
		{"external auto → ask", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession, Provenance: External}, ErrApprovalRequired},
		{"first-party ask", GrantRequest{Session: "s1", Capability: loopEgress("127.0.1.1:80"), Lifecycle: LifecycleSession}, ErrApprovalRequired},
		{"egress without TLS inspection, high risk (hard deny)", GrantRequest{Session: "high", Capability: loopEgress(x), Lifecycle: LifecycleSession}, ErrDenied},
		{"forged parent", GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession, Parent: "shk1_" + strings.Repeat("a", 52)}, ErrForgedHandle},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.Grants(""))
			_, err := a.Grant(ctx, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if n := len(liveHandles(t, d)); n != 0 {
				t.Fatalf("refusal left %d live backend handles", n)
			}
			if n := len(a.Grants("")); n != before {
				t.Fatalf("refusal added grant records (%d → %d)", before, n)
			}
		})
	}
	if n := len(a.PendingApprovals()); n != 2 {
		t.Fatalf("pending approvals = %d, want 2", n)
	}
	// A class the backend reports unavailable is not grantable.
	off := memory.MustNew(memory.Config{Classes: []backend.Strength{{Class: backend.ClassNetEgress, Level: backend.Unavailable, Mechanism: "none", Reason: "test: no egress here"}}})
	a2 := openAgent(t, off, t.TempDir())
	mustSession(t, a2, SessionSpec{ID: "s1"})
	if _, err := a2.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrNotEnforceable) {
		t.Fatalf("egress on a backend without it: %v", err)
	}
}

// TestManifestDirReload: a broken manifest file is rejected with file:line
// and the previous manifests keep deciding.
func TestManifestDirReload(t *testing.T) {
	d := memKernel(t)
	mdir := t.TempDir()
	writeFile(t, mdir+"/py.manifest", "image py\nallow net.egress cidrs=127.0.0.0/24\n")
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Manifests = nil; c.ManifestDir = mdir })
	mustSession(t, a, SessionSpec{ID: "s1"})
	const x = "127.0.0.2:8080"
	writeFile(t, mdir+"/py.manifest", "image py\nallow net.egress cidrs=127.0.0.0/24\nallow net.egres cidrs=10.0.0.0/8\n")
	if err := a.ReloadManifests(); !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), `py.manifest:3: unknown class "net.egres"`) {
		t.Fatalf("reload: %v", err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
		t.Fatalf("previous manifest not in force: %v", err)
	}
	writeFile(t, mdir+"/py.manifest", "image py\nallow net.egress cidrs=127.0.1.0/24\n")
	if err := a.ReloadManifests(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession}); !errors.Is(err, ErrOutsideManifest) {
		t.Fatalf("narrowed manifest: %v", err)
	}
}

// TestConcurrentUse: decisions run concurrently with grants, revokes and
// session churn (run with -race).
func TestConcurrentUse(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Breaker = BreakerConfig{Consecutive: 1 << 30, Total: 1 << 30} })
	mustSession(t, a, SessionSpec{ID: "s1"})
	const x = "127.0.0.2:8080"
	ap := netip.MustParseAddrPort(x)
	use := UseRequest{Class: ClassNetEgress, Op: "connect", IP: ap.Addr(), Port: ap.Port()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := a.Decide("s1", use); err != nil {
					t.Error(err)
					return
				}
				a.Breaker("s1")
			}
		}()
	}
	for i := 0; i < 30; i++ {
		g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress(x), Lifecycle: LifecycleSession})
		if err != nil {
			t.Fatal(err)
		}
		sid := fmt.Sprintf("tmp%d", i)
		mustSession(t, a, SessionSpec{ID: sid})
		if err := a.Revoke(ctx, g.Handle); err != nil {
			t.Fatal(err)
		}
		if err := a.EndSession(sid); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if n := len(liveHandles(t, d)); n != 0 {
		t.Fatalf("live handles: %d", n)
	}
}

// TestTwoOfThreeGate: a Notify grant that would complete the three
// ingredients goes to a human instead; without them it runs with a notice.
func TestTwoOfThreeGate(t *testing.T) {
	d := memKernel(t)
	events := &eventLog{}
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Events = events })
	mustSession(t, a, SessionSpec{ID: "plain"})
	mustSession(t, a, SessionSpec{ID: "risky"})
	pub := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
	g, err := a.Grant(ctx, GrantRequest{Session: "plain", Capability: pub, Lifecycle: LifecycleSession})
	if err != nil || g.Tier != TierNotify {
		t.Fatalf("plain session: %+v %v", g, err)
	}
	if !slices.Contains(events.kinds(), "grant.notify") {
		t.Fatalf("no notice for a Notify grant: %v", events.kinds())
	}
	if err := a.NoteIngredients("risky", Ingredients{ExternalIngestion: true, CredentialAccess: true}); err != nil {
		t.Fatal(err)
	}
	_, err = a.Grant(ctx, GrantRequest{Session: "risky", Capability: pub, Lifecycle: LifecycleSession})
	var are *ApprovalRequiredError
	if !errors.As(err, &are) || are.Tier != TierAsk {
		t.Fatalf("third ingredient unattended: %v", err)
	}
	if err := a.NoteIngredients("nope", Ingredients{}); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("unknown session: %v", err)
	}
}

// TestPolicyStoreIsForbidden: whatever a session was granted, writing the
// agent's state, policy or manifest directories is denied by Cedar.
func TestPolicyStoreIsForbidden(t *testing.T) {
	d := memKernel(t)
	state, pol, man := t.TempDir(), t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(man, "py.manifest"), "image py\nallow clipboard paste_in=true\n")
	// A standing admin permit that would allow every fs write.
	writeFile(t, filepath.Join(pol, "admin.cedar"), `@id("admin.all-writes") permit(principal, action == Shinken::Action::"use", resource == Shinken::Capability::"fs.scope");`)
	a := openAgent(t, d, state, func(c *Config) { c.Manifests, c.ManifestDir, c.PolicyDir = nil, man, pol })
	mustSession(t, a, SessionSpec{ID: "s1"})
	for _, p := range []string{filepath.Join(state, "state.json"), filepath.Join(pol, "x.cedar"), filepath.Join(man, "py.manifest")} {
		dec, err := a.Decide("s1", UseRequest{Class: ClassFSScope, Op: "write", Path: p})
		if err != nil {
			t.Fatal(err)
		}
		if dec.Allowed || !slices.Contains(dec.Reasons, "hard.policy-store.use") {
			t.Errorf("write %s: %+v", p, dec)
		}
	}
	if dec, _ := a.Decide("s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/work/x"}); !dec.Allowed {
		t.Fatalf("the admin permit itself does not work: %+v", dec)
	}
}
