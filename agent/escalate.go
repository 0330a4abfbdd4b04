package agent

// Escalation on denial (seeds/permissions.md §6.2): a kernel denial in a
// session can open an Ask card for exactly the missing scope, so a human
// sees "session X tried 203.0.113.7:443" and can approve it. Approving does
// not retry anything by itself. Off unless the session's image manifest says
// "escalate net.egress" (or "escalate net.inbound" for peers refused at a
// session's listener: EscalateInbound); rate-limited per session and
// destination, so a burst of denials opens one card.

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// EscalationWindow is how long one (session, destination) escalation holds:
// denials to it within the window open no further card (nor while its card
// is still pending).
var EscalationWindow = 10 * time.Minute

type escalations struct {
	mu   sync.Mutex
	last map[string]escalation
	open map[string][]openEscalation // per session: its escalation cards (escalate_cap.go)
	held map[string]*escalationHeld  // per session: escalations the cap held back
	// checked: per session, when the states of its open cards were read.
	checked map[string]time.Time
	// classes: per live session, the classes its manifest escalates. Set
	// under a.mu while the session exists, dropped under a.mu at its end
	// (forgetEscalations) and all at a manifest reload, so an entry is
	// always the live session's under the manifests in force: a flood of
	// denials to distinct destinations then takes no a.mu per denial
	// (escalates).
	classes map[string][]Class
}

type escalation struct {
	at   time.Time
	card string
}

// EscalateDenial is told of one kernel denial of session's egress to dst
// (the daemon calls it for every no-rule denial event). It returns the card
// that stands for that destination ("" when none: escalation off, rate
// limited after a refusal, or the scope outside the manifest) and whether
// this call opened it.
func (a *Agent) EscalateDenial(ctx context.Context, session string, dst netip.AddrPort) (card string, opened bool, err error) {
	ip := dst.Addr().Unmap()
	c := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}}}
	if dst.Port() != 0 {
		c.Egress.Ports = []PortRange{{Lo: dst.Port(), Hi: dst.Port()}}
	}
	return a.escalate(ctx, session, "out|"+dst.String(), c)
}

// EscalateInbound is told of one kernel refusal of a new inbound flow to
// session: a peer (its address) opening a flow to the session's local port
// (the daemon calls it for every no_inbound denial event, whose Dst is the
// peer's address with the session's port). The card asks for exactly that:
// net.inbound cidrs=<peer> ports=<port>. Rate-limited like EscalateDenial.
func (a *Agent) EscalateInbound(ctx context.Context, session string, peer netip.Addr, port uint16) (card string, opened bool, err error) {
	ip := peer.Unmap()
	c := Capability{Class: ClassNetInbound, Inbound: &InboundScope{CIDRs: []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}}}
	if port != 0 {
		c.Inbound.Ports = []PortRange{{Lo: port, Hi: port}}
	}
	return a.escalate(ctx, session, "in|"+netip.AddrPortFrom(ip, port).String(), c)
}

func (a *Agent) escalate(ctx context.Context, session, dest string, c Capability) (card string, opened bool, err error) {
	now := a.cfg.Now()
	key := session + "|" + dest
	a.esc.mu.Lock()
	e, ok := a.esc.last[key]
	a.esc.mu.Unlock()
	// a.esc.mu is never held while a.mu is taken (cardPending takes it):
	// the session's end takes a.esc.mu under a.mu.
	if ok && (now.Sub(e.at) < EscalationWindow || a.cardPending(e.card)) {
		return e.card, false, nil
	}
	if !a.escalates(session, c.Class) {
		a.claimEscalation(key, escalation{at: now}) // asked again only after the window
		return "", false, nil
	}
	// The session's cap of pending escalation cards, and one card per
	// prefix (escalate_cap.go): a flood opens no card past them.
	merged, ok, capped := a.reserveEscalation(session, c)
	if capped != nil {
		a.emit(*capped)
	}
	if !ok {
		return merged, false, nil
	}
	// Claim the key before the (slow) request, so a burst opens one card.
	a.claimEscalation(key, escalation{at: now})

	res, err := a.Request(ctx, []GrantRequest{{Session: session, Capability: c, Lifecycle: LifecycleOnce, Requester: "kernel-denial", Escalation: true}})
	if err != nil || len(res) == 0 {
		a.settleEscalation(session, c, "")
		return "", false, err
	}
	outcome := res[0].Outcome
	a.emit(Event{Kind: "escalation", Session: session, Class: c.Class, ParamsSHA256: paramsHash(c), Outcome: outcome + " " + res[0].Card + " " + res[0].Reason})
	if outcome != "pending" {
		a.settleEscalation(session, c, "")
		return "", false, nil // outside the manifest, breaker, ...: nothing to ask
	}
	a.settleEscalation(session, c, res[0].Card)
	a.claimEscalation(key, escalation{at: now, card: res[0].Card})
	return res[0].Card, true, nil
}

// claimEscalation records e for key. The map is bounded: past 65,536 keys
// those older than the window go, and if that is not enough, all of them
// (which only costs a later denial a second look).
func (a *Agent) claimEscalation(key string, e escalation) {
	a.esc.mu.Lock()
	defer a.esc.mu.Unlock()
	if a.esc.last == nil {
		a.esc.last = map[string]escalation{}
	}
	a.esc.last[key] = e
	if len(a.esc.last) > 65536 {
		for k, o := range a.esc.last {
			if e.at.Sub(o.at) >= EscalationWindow {
				delete(a.esc.last, k)
			}
		}
		if len(a.esc.last) > 65536/2 {
			clear(a.esc.last)
			a.esc.last[key] = e
		}
	}
}

// escalates says whether session's manifest escalates denials of class c
// (a session's image never changes; ReloadManifests clears what is known).
func (a *Agent) escalates(session string, c Class) bool {
	a.esc.mu.Lock()
	cls, known := a.esc.classes[session]
	a.esc.mu.Unlock()
	if known {
		return slices.Contains(cls, c)
	}
	a.mu.Lock()
	defer a.unlock()
	s, ok := a.st.Sessions[session]
	if !ok {
		return false
	}
	cls = []Class{}
	if m := a.manifests[s.Spec.Image]; m != nil {
		cls = append(cls, m.Escalate...)
	}
	a.esc.mu.Lock() // under a.mu, as at the session's end
	if a.esc.classes == nil {
		a.esc.classes = map[string][]Class{}
	}
	a.esc.classes[session] = cls
	a.esc.mu.Unlock()
	return slices.Contains(cls, c)
}

func (a *Agent) cardPending(id string) bool {
	if id == "" {
		return false
	}
	c, err := a.Card(id)
	return err == nil && c.Status == CardPending
}
