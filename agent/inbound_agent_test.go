package agent

// net.inbound through the agent, on the memory backend (no root, any GOOS):
// a new inbound flow is asked of the backend's Accept, which decides as the
// kernel's ingress hook does (the kernel's own are dataplane's inbound
// tests).

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestInboundThroughTheAgent: net.inbound is its own grant. A peer
// connecting to a session's listener is refused by the backend without it
// (also with an egress grant covering the peer), admitted once the agent
// grants net.inbound for that peer and port, refused again after the revoke
// (the next connect). Its default tier is ask; a child cannot widen it; a
// refusal escalates to a card for exactly the peer and the port.
func TestInboundThroughTheAgent(t *testing.T) {
	d := memKernel(t)
	a, log := inboundAgent(t, d)
	// The session listens on port; the peer connects from 127.0.0.12.
	const port = uint16(8080)
	dial := func() error {
		why, err := d.Accept("w", netip.MustParseAddrPort("127.0.0.12:40000"), port, backend.ProtoTCP)
		if err == nil && why != backend.ReasonNone {
			err = fmt.Errorf("refused: %s", why)
		}
		return err
	}
	testInbound(t, a, log, port, dial, nil)
}

// inboundAgent: an agent on d whose image "web" may ask net.inbound (auto
// from 127.0.0.0/24, ask from 127.0.1.0/24) and escalates it, and its
// session w.
func inboundAgent(t *testing.T, d Kernel) (*Agent, *eventLog) {
	t.Helper()
	ms, err := ParseManifests("in.manifest", []byte(`image web
allow net.egress cidrs=127.0.0.0/24
allow net.inbound cidrs=127.0.0.0/24 tier=auto
allow net.inbound cidrs=127.0.1.0/24
escalate net.inbound
`))
	if err != nil {
		t.Fatal(err)
	}
	log := &eventLog{}
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.Manifests = map[string]*Manifest{"web": ms[0]}; c.Events = log })
	mustSession(t, a, SessionSpec{ID: "w", Image: "web"})
	return a, log
}

// testInbound runs the net.inbound sequence on session w: dial opens the
// peer 127.0.0.12's flow to w's port (nil: admitted); admitted, when set,
// runs after the dial the grant admitted (the kernel test accepts the
// connection at the listener).
func testInbound(t *testing.T, a *Agent, log *eventLog, port uint16, dial func() error, admitted func()) {
	t.Helper()
	inbound := func(cidr string, ports ...PortRange) Capability {
		return Capability{Class: ClassNetInbound, Inbound: &InboundScope{CIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}, Ports: ports}}
	}

	if dial() == nil {
		t.Fatal("a peer connected to a session listener without any grant")
	}
	if _, err := a.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.12/32")}}}}); err != nil {
		t.Fatal(err)
	}
	if dial() == nil {
		t.Fatal("an egress grant for the peer admitted it in")
	}
	// Default tier: ask (127.0.1.0/24 has no tier in the manifest).
	if _, err := a.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: inbound("127.0.1.5/32")}); !errors.Is(err, ErrApprovalRequired) {
		t.Errorf("net.inbound at its default tier: %v, want %v", err, ErrApprovalRequired)
	}
	g, err := a.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: inbound("127.0.0.12/32", PortRange{Lo: port, Hi: port})})
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(); err != nil {
		t.Fatalf("dial with net.inbound granted: %v", err)
	}
	if admitted != nil {
		admitted()
	}
	// Attenuation: a child may narrow, never widen (a wider prefix, another
	// port, every port).
	for _, c := range []Capability{inbound("127.0.0.0/24", PortRange{Lo: port, Hi: port}), inbound("127.0.0.12/32", PortRange{Lo: port + 1, Hi: port + 1}), inbound("127.0.0.12/32")} {
		if _, err := a.Attenuate(ctx, g.Handle, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: c}); !errors.Is(err, ErrWidens) {
			t.Errorf("attenuate to %s: %v, want %v", c, err, ErrWidens)
		}
	}
	if _, err := a.Attenuate(ctx, g.Handle, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: inbound("127.0.0.12/32", PortRange{Lo: port, Hi: port})}); err != nil {
		t.Errorf("attenuate to the same scope: %v", err)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if dial() == nil {
		t.Fatal("a peer connected after the inbound grant was revoked")
	}
	found := false
	for _, e := range log.ev {
		found = found || e.Kind == "grant.issue" && e.Class == ClassNetInbound
	}
	if !found {
		t.Errorf("no grant audit event of class net.inbound: %v", log.kinds())
	}

	// Escalation: the refusal becomes one card for exactly that peer and
	// port; a burst opens no second one.
	card, opened, err := a.EscalateInbound(ctx, "w", netip.MustParseAddr("127.0.0.12"), port)
	if err != nil || !opened {
		t.Fatalf("escalate: %q %v %v", card, opened, err)
	}
	if _, again, _ := a.EscalateInbound(ctx, "w", netip.MustParseAddr("127.0.0.12"), port); again {
		t.Error("a second card for the same peer and port")
	}
	var esc []Card
	for _, c := range a.Cards(false) {
		if len(c.Items) == 1 && c.Items[0].Actor == "kernel-denial" {
			esc = append(esc, c)
		}
	}
	if len(esc) != 1 || esc[0].Items[0].Scope.Class != ClassNetInbound || esc[0].Items[0].Lifecycle != LifecycleOnce ||
		esc[0].Items[0].Scope.String() != fmt.Sprintf("net.inbound cidrs=127.0.0.12/32 ports=%d", port) {
		t.Fatalf("escalation cards %+v: want one net.inbound card for 127.0.0.12 port %d", esc, port)
	}
}
