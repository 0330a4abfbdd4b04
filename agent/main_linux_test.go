package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"testing"

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// Tier-3 tests: the agent against the real dataplane, as root. Each test makes
// its own dataplane (unique parent cgroup and pin path) and uninstalls it.

func TestMain(m *testing.M) { kerneltest.Main(m, map[string]func(){crashChildEnv: crashChildMain}) }

var ctx = context.Background()

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func kernelConfig() dataplane.Config {
	parent, pin := kerneltest.Private("shinken-agent-test-")
	return dataplane.Config{Parent: parent, PinPath: pin, MaxSessions: 256, MaxHandles: 1024, MaxEgress4: 1 << 12, MaxEgress6: 1 << 12}
}

// newKernel opens a private dataplane and uninstalls it when the test ends.
func newKernel(t testing.TB) (*dataplane.Dataplane, dataplane.Config) {
	t.Helper()
	kerneltest.RequireRoot(t)
	cfg := kernelConfig()
	d, err := dataplane.Open(cfg)
	if err != nil {
		t.Fatalf("open dataplane: %v", err)
	}
	t.Cleanup(func() {
		// Whatever process opened it last, remove everything.
		if d2, err := dataplane.Open(cfg); err == nil {
			if err := d2.Uninstall(); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}
		d.Close()
	})
	return d, cfg
}

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

func loopEgress(addr string) Capability {
	ap := netip.MustParseAddrPort(addr)
	return Capability{Class: ClassNetEgress, Egress: &EgressScope{
		CIDRs: []netip.Prefix{netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen())},
		Ports: []PortRange{{Lo: ap.Port(), Hi: ap.Port()}},
	}}
}

// ---- processes inside sessions ----

// startProbe starts a probe process inside the kernel session.
func startProbe(t testing.TB, d *dataplane.Dataplane, session string) *probe.Proc {
	t.Helper()
	s, err := d.Session(session)
	if err != nil {
		t.Fatal(err)
	}
	return probe.Start(t, func(c *exec.Cmd) error { return dataplane.StartIn(s, c, dataplane.ProcOptions{}) })
}

func listenTCP(t testing.TB, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// ---- kernel inspection ----

func liveHandles(t testing.TB, k Kernel) []dataplane.Handle {
	t.Helper()
	snap, err := k.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var out []dataplane.Handle
	for _, h := range snap.Handles {
		if h.State.Alive() {
			out = append(out, h)
		}
	}
	return out
}

func kernelRules(t testing.TB, k Kernel, session string) []dataplane.EgressRule {
	t.Helper()
	snap, err := k.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return snap.Deltas[session].AddressRules()
}
