package agent

// Escalation from the kernel's own denial events: the burst of
// escalate_test.go with 1,000 real connects from a probe in the session.

import (
	"testing"

	"github.com/shinken-agent/shinken/dataplane/probe"
)

// TestEscalationBurstKernel: testEscalationBurst on the kernel.
func TestEscalationBurstKernel(t *testing.T) {
	d, _ := newKernel(t)
	srv := listenTCP(t, "127.0.0.9:0")
	var p *probe.Proc
	testEscalationBurst(t, d, srv, func(i int) {
		if p == nil {
			p = startProbe(t, d, "s1") // the session exists once the burst starts
		}
		if got := p.DoAsync("tcp " + srv); got != "err EPERM" {
			t.Fatalf("connect %d: %s", i, got)
		}
	})
}
