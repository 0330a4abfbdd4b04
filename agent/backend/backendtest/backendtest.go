package backendtest

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// User makes a use the way a session process would and says what the
// backend decided: backend.ReasonNone when it was allowed, else the reason
// it was denied. A backend that models its checks in memory implements it
// itself; a kernel backend gets one through WithUser.
type User interface {
	Connect(session string, dst netip.AddrPort, proto backend.Proto) (backend.Reason, error)
}

// Option adjusts Run.
type Option func(*config)

type config struct {
	user     func(t *testing.T, b backend.Backend) User
	launch   func() *exec.Cmd
	fileOpen func(t *testing.T) backend.Backend
	fileUser func(t *testing.T, b backend.Backend) FileUser
	procOpen func(t *testing.T) backend.Backend
	procUser func(t *testing.T, b backend.Backend) ProcessUser
}

// WithUser gives the suite its way of making uses on a backend that does
// not implement User (a kernel backend: connect from a process inside the
// session). It is called once per subtest that makes uses.
func WithUser(f func(t *testing.T, b backend.Backend) User) Option {
	return func(c *config) { c.user = f }
}

// WithLaunchCommand sets the command the launch subtest runs in a session
// (it must exit 0). The default is "true" from PATH.
func WithLaunchCommand(f func() *exec.Cmd) Option {
	return func(c *config) { c.launch = f }
}

// Run runs the conformance suite against the backends open returns, a
// fresh one per subtest.
func Run(t *testing.T, open func(t *testing.T) backend.Backend, opts ...Option) {
	s := &suite{open: open}
	for _, o := range opts {
		o(&s.cfg)
	}
	for _, c := range []struct {
		name string
		f    func(*testing.T, *suite)
	}{
		{"Probe", testProbe},
		{"Sessions", testSessions},
		{"SessionNames", testSessionNames},
		{"Limits", testLimits},
		{"Apply", testApply},
		{"ApplyAllOrNothing", testApplyAllOrNothing},
		{"AllowEgress", testAllowEgress},
		{"DNSEntryCap", testDNSEntryCap},
		{"Release", testRelease},
		{"Revoke", testRevoke},
		{"Membrane", testMembrane},
		{"ChainBound", testChainBound},
		{"Generations", testGenerations},
		{"ApproveOnce", testApproveOnce},
		{"Snapshot", testSnapshot},
		{"DestroySession", testDestroySession},
		{"DNS", testDNS},
		{"Telemetry", testTelemetry},
		{"UseLookup", testUseLookup},
		{"UseMembrane", testUseMembrane},
		{"UseGenerations", testUseGenerations},
		{"UseOnce", testUseOnce},
		{"UseExpiry", testUseExpiry},
		{"UseNeverList", testUseNeverList},
		{"UseDenyList", testUseDenyList},
		{"UseEvents", testUseEvents},
		{"Launch", testLaunch},
		{"FilesApply", testFilesApply},
		{"UseFiles", testUseFiles},
		{"UseFilesNested", testUseFilesNested},
		{"ProcessApply", testProcessApply},
		{"UseProcess", testUseProcess},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, s) })
	}
}

type suite struct {
	open func(t *testing.T) backend.Backend
	cfg  config
}

// backend opens a fresh backend.
func (s *suite) backend(t *testing.T) backend.Backend {
	t.Helper()
	b := s.open(t)
	if b == nil {
		t.Fatal("open returned a nil backend")
	}
	return b
}

// user opens a fresh backend and the way to make uses on it; it skips the
// test when there is none.
func (s *suite) user(t *testing.T) (backend.Backend, User) {
	t.Helper()
	b := s.backend(t)
	if s.cfg.user != nil {
		return b, s.cfg.user(t, b)
	}
	if u, ok := b.(User); ok {
		return b, u
	}
	t.Skipf("%T implements no backendtest.User and Run was given no WithUser: uses cannot be made, so use-time behaviour is not checked here", b)
	return nil, nil
}

// ---- helpers ----

var never time.Time

func mustSession(t *testing.T, b backend.Backend, name string) backend.Session {
	t.Helper()
	s, err := b.CreateSession(name, backend.Limits{})
	if err != nil {
		t.Fatalf("create session %s: %v", name, err)
	}
	return s
}

func mustHandle(t *testing.T, b backend.Backend, parent backend.HandleRef) backend.HandleRef {
	t.Helper()
	h, err := b.NewHandle(parent, never)
	if err != nil {
		t.Fatalf("new handle (parent %s): %v", parent, err)
	}
	if h.IsZero() {
		t.Fatalf("new handle (parent %s) is the zero reference", parent)
	}
	return h
}

func mustApply(t *testing.T, b backend.Backend, session string, d backend.Delta) {
	t.Helper()
	if err := b.Apply(session, d); err != nil {
		t.Fatalf("apply %v to %s: %v", d, session, err)
	}
}

func mustRevoke(t *testing.T, b backend.Backend, ref backend.HandleRef) {
	t.Helper()
	if err := b.Revoke(ref); err != nil {
		t.Fatalf("revoke %s: %v", ref, err)
	}
}

// egress is an egress rule on prefix (a bare address is its /32 or /128)
// and one port (0: every port), any protocol.
func egress(prefix string, port uint16, h backend.HandleRef) backend.EgressRule {
	return backend.EgressRule{Prefix: prefixOf(prefix), Ports: portRange(port), Handle: h}
}

// inbound is an inbound rule: peers in prefix may open flows to the
// session's port.
func inbound(prefix string, port uint16, h backend.HandleRef) backend.EgressRule {
	return backend.EgressRule{Prefix: prefixOf(prefix), Ports: portRange(port), Handle: h, Inbound: true}
}

func prefixOf(s string) netip.Prefix {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p
	}
	a := netip.MustParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen())
}

func portRange(p uint16) backend.PortRange {
	if p == 0 {
		return backend.AnyPort
	}
	return backend.Port(p)
}

func state(t *testing.T, b backend.Backend, ref backend.HandleRef) backend.HandleState {
	t.Helper()
	st, err := b.HandleState(ref)
	if err != nil {
		t.Fatalf("handle state %s: %v", ref, err)
	}
	return st
}

func wantState(t *testing.T, b backend.Backend, ref backend.HandleRef, want backend.HandleState) {
	t.Helper()
	if got := state(t, b, ref); got != want {
		t.Fatalf("handle %s is %s, want %s", ref, got, want)
	}
}

func snapshot(t *testing.T, b backend.Backend) backend.Snapshot {
	t.Helper()
	snap, err := b.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return snap
}

// rulesOf is what the backend holds for session, section by section.
func rulesOf(t *testing.T, b backend.Backend, session string) backend.Delta {
	t.Helper()
	return snapshot(t, b).Deltas[session]
}

// sameDelta reports, as an error, how got and want differ as multisets of
// entries per section (expiries aside).
func sameDelta(got, want backend.Delta) error {
	for _, s := range []struct {
		name      string
		got, want []backend.EgressRule
	}{{"egress", got.Egress, want.Egress}, {"inbound", got.Inbound, want.Inbound}} {
		left := slices.Clone(s.got)
		for _, r := range s.want {
			i := slices.IndexFunc(left, func(k backend.EgressRule) bool { return backend.SameRule(k, r) })
			if i < 0 {
				return fmt.Errorf("%s section lacks %s (holds %v)", s.name, r, s.got)
			}
			left = slices.Delete(left, i, i+1)
		}
		if len(left) > 0 {
			return fmt.Errorf("%s section holds %v besides what was applied", s.name, left)
		}
	}
	return nil
}

func wantDelta(t *testing.T, b backend.Backend, session string, want backend.Delta) {
	t.Helper()
	if err := sameDelta(rulesOf(t, b, session), want); err != nil {
		t.Fatalf("session %s: %v", session, err)
	}
}

// handleIn returns ref's row of the snapshot.
func handleIn(snap backend.Snapshot, ref backend.HandleRef) (backend.Handle, bool) {
	for _, h := range snap.Handles {
		if h.Ref == ref {
			return h, true
		}
	}
	return backend.Handle{}, false
}

// wantErr fails unless err wraps target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// opsDelta is what a call cost in revoke writes and sweeps.
func opsDelta(b backend.Backend, f func()) backend.Ops {
	before := b.Ops()
	f()
	after := b.Ops()
	return backend.Ops{RevokeWrites: after.RevokeWrites - before.RevokeWrites, Sweeps: after.Sweeps - before.Sweeps, ViewSweeps: after.ViewSweeps - before.ViewSweeps}
}
