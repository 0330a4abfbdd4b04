package agent

// Helpers the agent's tests share on any backend and any GOOS: the test
// manifest, an event log, opening an agent on a Kernel (the Linux dataplane
// from newKernel, main_linux_test.go, as root; the memory backend from
// memKernel anywhere, without root), and reading what the backend holds.
// A use the kernel tests make with a real connect from a probe process is
// asked of the memory backend's Connect or Accept, which decide as the
// kernel hooks do (wantAllowed, wantDenied, wantUse).

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

var ctx = context.Background()

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const testManifest = `image py
allow net.egress cidrs=127.0.0.0/24,::1/128                       # loopback: auto by default
allow net.egress cidrs=127.0.1.0/24 tier=ask                       # a "new destination" needing a human
allow net.egress domains=**.example.com cidrs=192.0.2.0/24 ports=443
allow net.egress cidrs=198.51.100.0/24 ports=443 tier=notify
allow fs.scope read=/work write=/work/out
allow clipboard paste_in=true
allow credentials broker_scopes=github:read
`

func testManifests(t testing.TB) map[string]*Manifest {
	ms, err := ParseManifests("test.manifest", []byte(testManifest))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*Manifest{"py": ms[0]}
}

type eventLog struct {
	mu sync.Mutex
	ev []Event
}

func (l *eventLog) Emit(e Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ev = append(l.ev, e)
	return nil
}

func (l *eventLog) kinds() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.ev {
		out = append(out, e.Kind)
	}
	return out
}

func (l *eventLog) has(kind string) bool { return slices.Contains(l.kinds(), kind) }

// memKernel is a fresh memory backend sized as the kernel tests' dataplane.
func memKernel(t testing.TB) *memory.Backend {
	t.Helper()
	return memory.MustNew(memory.Config{MaxSessions: 256, MaxHandles: 1024})
}

func openAgent(t testing.TB, k Kernel, stateDir string, mod ...func(*Config)) *Agent {
	t.Helper()
	cfg := Config{StateDir: stateDir, Kernel: k, Manifests: testManifests(t), Logger: quiet, Events: &eventLog{}}
	for _, m := range mod {
		m(&cfg)
	}
	a, err := Open(cfg)
	if err != nil {
		t.Fatalf("open agent: %v", err)
	}
	return a
}

func mustSession(t testing.TB, a *Agent, spec SessionSpec) {
	t.Helper()
	if spec.Image == "" {
		spec.Image = "py"
	}
	if err := a.CreateSession(spec); err != nil {
		t.Fatalf("create session %s: %v", spec.ID, err)
	}
}

// loopEgress is a net.egress capability for one address and port.
func loopEgress(addr string) Capability {
	ap := netip.MustParseAddrPort(addr)
	return Capability{Class: ClassNetEgress, Egress: &EgressScope{
		CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen())},
		Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}},
	}}
}

// ---- backend inspection ----

func liveHandles(t testing.TB, k Kernel) []backend.Handle {
	t.Helper()
	snap, err := k.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var out []backend.Handle
	for _, h := range snap.Handles {
		if h.State.Alive() {
			out = append(out, h)
		}
	}
	return out
}

func kernelRules(t testing.TB, k Kernel, session string) []backend.EgressRule {
	t.Helper()
	snap, err := k.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return snap.Deltas[session].AddressRules()
}

// ---- uses, decided by the memory backend ----

// connectTCP is what the memory backend decides for a TCP connect from session to
// dst (an approve-once handle that allows it is consumed).
func connectTCP(t testing.TB, b *memory.Backend, session, dst string) backend.Reason {
	t.Helper()
	r, err := b.Connect(session, netip.MustParseAddrPort(dst), backend.ProtoTCP)
	if err != nil {
		t.Fatalf("connect %s to %s: %v", session, dst, err)
	}
	return r
}

func wantUse(t testing.TB, b *memory.Backend, session, dst string, want backend.Reason) {
	t.Helper()
	if got := connectTCP(t, b, session, dst); got != want {
		t.Fatalf("connect %s to %s: %s, want %s", session, dst, got, want)
	}
}

// wantAllowed and wantDenied are the two outcomes the kernel tests tell
// apart ("ok" and "err EPERM" from a probe).
func wantAllowed(t testing.TB, b *memory.Backend, session string, dsts ...string) {
	t.Helper()
	for _, d := range dsts {
		wantUse(t, b, session, d, backend.ReasonNone)
	}
}

func wantDenied(t testing.TB, b *memory.Backend, session string, dsts ...string) {
	t.Helper()
	for _, d := range dsts {
		if got := connectTCP(t, b, session, d); got == backend.ReasonNone {
			t.Fatalf("connect %s to %s allowed, want denied", session, d)
		}
	}
}
