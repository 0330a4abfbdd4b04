package agent

import (
	"net"
	"os/exec"
	"testing"

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// Tier-3 tests: the agent against the real dataplane, as root. Each test makes
// its own dataplane (unique parent cgroup and pin path) and uninstalls it.
// What needs no kernel runs on the memory backend (setup_test.go).

func TestMain(m *testing.M) {
	boundary.Main() // the session launcher re-executes the test binary (tests with the boundary)
	kerneltest.Main(m, map[string]func(){crashChildEnv: crashChildMain})
}

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
