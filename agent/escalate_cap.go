package agent

import (
	"fmt"
	"net/netip"
	"time"
)

// Escalation under a flood: a session's denials to many destinations open
// at most Config.EscalationCards pending escalation cards, and one card
// stands for a whole destination prefix (a /24 for IPv4, a /48 for IPv6,
// per class) while it is pending:
//
//   - a denial whose prefix has a pending escalation card of the session
//     opens none (the card stands for it; "merged"); once that card is
//     decided or expires, a later denial asks again;
//   - a denial of a new prefix when the session already has its cap of
//     pending escalation cards opens none ("capped"), and is counted; the
//     first held back, and then at most one a second, emit an
//     escalation.capped event with the number held back since the last one
//     (never silent); a card decided or expired frees its place;
//   - neither path calls Request: a flood costs a map lookup per denial
//     and one agent-lock hold to read the pending cards' states, never a
//     decision, a card or a state write.

// DefaultEscalationCards is Config.EscalationCards's default.
const DefaultEscalationCards = 16

// openEscalation is one of a session's escalation cards (card "": its
// request is being made).
type openEscalation struct {
	card   string
	class  Class
	prefix netip.Prefix
}

// escalationHeld counts a session's escalations held back by the cap.
type escalationHeld struct {
	since    uint64    // since the last escalation.capped event
	reported time.Time // when that event was emitted
}

// escalationPrefix is the prefix one escalation card stands for.
func escalationPrefix(c Capability) netip.Prefix {
	var cidrs []netip.Prefix
	switch {
	case c.Egress != nil:
		cidrs = c.Egress.CIDRs
	case c.Inbound != nil:
		cidrs = c.Inbound.CIDRs
	}
	if len(cidrs) == 0 {
		return netip.Prefix{}
	}
	a := cidrs[0].Addr().Unmap()
	bits := 24
	if a.Is6() {
		bits = 48
	}
	p, _ := a.Prefix(bits)
	return p
}

// pendingCards reports, under one hold of a.mu, which of ids are pending
// cards ("" counts as pending: a request in flight).
func (a *Agent) pendingCards(ids []string) []bool {
	out := make([]bool, len(ids))
	a.mu.Lock()
	defer a.unlock()
	for i, id := range ids {
		if id == "" {
			out[i] = true
			continue
		}
		c, ok := a.st.Cards[id]
		out[i] = ok && c.Status == CardPending
	}
	return out
}

// escalationRecheck is how long the pending cards' states read for a
// session are trusted: within it a flood of denials reads none again.
const escalationRecheck = 100 * time.Millisecond

// reserveEscalation decides whether session may open an escalation card
// for c: it returns the pending card that stands for c's prefix (merged),
// or ok true with a place reserved (release it with settleEscalation), or
// neither (capped; then, at most once a second, the escalation.capped
// event to emit). a.esc.mu not held.
func (a *Agent) reserveEscalation(session string, c Capability) (merged string, ok bool, capped *Event) {
	pfx := escalationPrefix(c)
	now := a.cfg.Now()
	a.esc.mu.Lock()
	open := append([]openEscalation(nil), a.esc.open[session]...)
	fresh := now.Sub(a.esc.checked[session]) < escalationRecheck && now.Sub(a.esc.checked[session]) >= 0
	a.esc.mu.Unlock()
	ids := make([]string, len(open))
	for i, o := range open {
		ids[i] = o.card
	}
	pending := make([]bool, len(open))
	if fresh {
		for i := range pending {
			pending[i] = true
		}
	} else {
		pending = a.pendingCards(ids)
	}

	a.esc.mu.Lock()
	defer a.esc.mu.Unlock()
	if a.esc.open == nil {
		a.esc.open = map[string][]openEscalation{}
		a.esc.checked = map[string]time.Time{}
	}
	if !fresh {
		a.esc.checked[session] = now
	}
	// Keep what is still pending (and what was added meanwhile).
	done := map[string]bool{}
	for i, o := range open {
		if !pending[i] {
			done[o.card] = true
		}
	}
	var live []openEscalation
	for _, o := range a.esc.open[session] {
		if !done[o.card] || o.card == "" {
			live = append(live, o)
		}
	}
	for _, o := range live {
		if o.class == c.Class && o.prefix == pfx {
			if o.card == "" {
				a.esc.open[session] = live
				return "", false, nil // its request is being made: it will stand for this one
			}
			a.esc.open[session] = live
			return o.card, false, nil
		}
	}
	if len(live) >= a.cfg.EscalationCards {
		a.esc.open[session] = live
		h := a.esc.held[session]
		if h == nil {
			if a.esc.held == nil {
				a.esc.held = map[string]*escalationHeld{}
			}
			h = &escalationHeld{}
			a.esc.held[session] = h
		}
		h.since++
		if now.Sub(h.reported) >= time.Second {
			n := h.since
			h.since, h.reported = 0, now
			return "", false, &Event{Kind: EventEscalationCapped, Session: session, Class: c.Class,
				Outcome: fmt.Sprintf("%d escalation(s) held back: %d escalation cards pending (max %d)", n, len(live), a.cfg.EscalationCards)}
		}
		return "", false, nil
	}
	a.esc.open[session] = append(live, openEscalation{class: c.Class, prefix: pfx})
	return "", true, nil
}

// settleEscalation replaces the place reserveEscalation made for c's prefix
// with card, or frees it (card "").
func (a *Agent) settleEscalation(session string, c Capability, card string) {
	pfx := escalationPrefix(c)
	a.esc.mu.Lock()
	defer a.esc.mu.Unlock()
	open := a.esc.open[session]
	for i, o := range open {
		if o.card == "" && o.class == c.Class && o.prefix == pfx {
			if card == "" {
				a.esc.open[session] = append(open[:i:i], open[i+1:]...)
			} else {
				open[i].card = card
			}
			break
		}
	}
	if len(a.esc.open[session]) == 0 {
		delete(a.esc.open, session)
		delete(a.esc.checked, session)
	}
}

// EventEscalationCapped: escalations a session's cap held back (Outcome
// says how many since the last such event).
const EventEscalationCapped = "escalation.capped"

// forgetEscalations drops what the cap keeps for an ended session.
func (a *Agent) forgetEscalations(session string) {
	a.esc.mu.Lock()
	defer a.esc.mu.Unlock()
	delete(a.esc.open, session)
	delete(a.esc.held, session)
	delete(a.esc.checked, session)
	delete(a.esc.classes, session)
}
