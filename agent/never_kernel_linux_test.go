package agent

// The never-list cases of never_test.go on the real kernel: real connects
// from a probe in the session, to real listeners.

import (
	"testing"

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// TestNeverListThroughTheKernel: testNeverList with real connects.
func TestNeverListThroughTheKernel(t *testing.T) {
	d, _ := newKernel(t)
	own := listenTCP(t, "127.0.0.6:0") // stands for the agent's metrics listener
	testNeverList(t, d, probeReach(d), own, listenTCP(t, "127.0.0.7:0"))
}

// TestNeverExceptionTwoGrantsKernel: testNeverTwoGrants with real connects.
func TestNeverExceptionTwoGrantsKernel(t *testing.T) {
	d, _ := newKernel(t)
	testNeverTwoGrants(t, d, probeReach(d), listenTCP(t, "127.0.0.6:0")) // stands for a metadata address
}

// probeReach connects from a probe started in the session (one per
// session, kept): ok is a flow, EPERM the kernel's refusal; any other
// answer fails the test.
func probeReach(d *dataplane.Dataplane) reach {
	probes := map[string]*probe.Proc{}
	return func(t *testing.T, session, dst string) bool {
		t.Helper()
		p := probes[session]
		if p == nil {
			p = startProbe(t, d, session)
			probes[session] = p
		}
		switch got := p.DoAsync("tcp " + dst); got {
		case "ok":
			return true
		case "err EPERM":
			return false
		default:
			t.Fatalf("tcp %s from %s: %s, want ok or err EPERM", dst, session, got)
			return false
		}
	}
}
