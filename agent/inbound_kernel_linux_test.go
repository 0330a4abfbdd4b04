package agent

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestInboundThroughTheKernel: net.inbound is its own grant, end to end
// through the kernel (TestInboundThroughTheAgent checks the same grants on
// the memory backend, without root; this one also sees the session's
// listener accept the admitted peer's connection). A
// peer connecting to a session's listener is refused in the kernel without
// it (also with an egress grant covering the peer), admitted once the agent
// grants net.inbound for that peer and port, refused again after the revoke
// (the next connect). Its default tier is ask; a child cannot widen it; a
// refusal escalates to a card for exactly the peer and the port.
func TestInboundThroughTheKernel(t *testing.T) {
	d, _ := newKernel(t)
	a, log := inboundAgent(t, d)
	p := startProbe(t, d, "w")
	got := p.Do("listen l 127.0.0.1:0")
	if !strings.HasPrefix(got, "ok ") {
		t.Fatalf("listen: %s", got)
	}
	target := "127.0.0.1:" + strings.TrimPrefix(got, "ok ")
	dial := func() error {
		dl := net.Dialer{Timeout: 300 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.12")}}
		c, err := dl.Dial("tcp", target)
		if err == nil {
			c.Close()
		}
		return err
	}
	testInbound(t, a, log, netip.MustParseAddrPort(target).Port(), dial, func() {
		if got := p.Do("accept l c 1000"); got != "ok" {
			t.Fatalf("accept: %s", got)
		}
	})
}
