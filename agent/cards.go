package agent

// Approval cards (seeds/permissions.md §6.3) and approved patterns. The
// Ask-tier requests of one batch (Request) are grouped into one card per
// session and tier and decided together; "approve this pattern" answers the
// same scope asked again by the same session without a card. Cards and
// patterns are records of the agent's state, written under the same lock and
// into the same store as the approvals they track.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Errors of the card protocol.
var (
	ErrUnknownCard = errors.New("no such card")
	ErrCardDecided = errors.New("card already decided")
)

// RequestResult is the outcome of one request of a batch.
type RequestResult struct {
	Outcome string // granted | pending | denied
	Grant   *Grant // granted
	Card    string // pending: the card it waits on
	Reason  string
	Pattern string        // the approved pattern (its card) that answered the request
	Err     error         // denied: why
	Took    time.Duration // how long the decision took (the grant call)
}

// Request runs a batch of grant requests. Auto and Notify ones are granted
// at once; an Ask that a pattern approved earlier is approved by it; the
// other Asks wait as pending approvals, batched into one card per session
// and tier (never across tiers). Refusals are per request; the error is for
// a failure to record the requests or the cards (the grants made stay made).
func (a *Agent) Request(ctx context.Context, reqs []GrantRequest) (_ []RequestResult, err error) {
	for _, req := range reqs {
		if req.Capability.Validate() == nil {
			a.prove(req.Session, req.Capability, a.cfg.Now()) // before the lock (prove.go)
		}
	}
	a.mu.Lock()
	defer a.unlock()
	if err := a.recordRequests(ctx, reqs); err != nil {
		return nil, err
	}
	out := make([]RequestResult, len(reqs))
	defer func() {
		// The request records no grant committed (a refusal's): durable
		// before the answer.
		if cerr := a.commit(nil); cerr != nil {
			err = errors.Join(err, fmt.Errorf("record the requests: %w", cerr))
		}
		for _, o := range out {
			a.emit(Event{Kind: EventRequestDecided, Outcome: o.Outcome, Took: o.Took})
		}
	}()
	batch := map[string][]string{} // session, tier → approval ids
	var keys []string
	for i, req := range reqs {
		t0 := time.Now()
		g, err := a.grantCounted(ctx, req)
		took := time.Since(t0)
		var are *ApprovalRequiredError
		switch {
		case err == nil:
			out[i] = RequestResult{Outcome: "granted", Grant: g, Took: took}
		case errors.As(err, &are):
			if p, ok := a.matchPattern(req); ok {
				g, err := a.approveAsLocked(ctx, are.ID, "pattern:"+p.Card+" by "+p.Decider, LifecycleSession)
				if err != nil {
					out[i] = RequestResult{Outcome: "denied", Reason: err.Error(), Pattern: p.Card, Err: err, Took: took}
				} else {
					out[i] = RequestResult{Outcome: "granted", Grant: g, Reason: "approved by pattern " + p.Card, Pattern: p.Card, Took: took}
				}
				continue
			}
			key := req.Session + "\x00" + are.Tier.String()
			if _, ok := batch[key]; !ok {
				keys = append(keys, key)
			}
			batch[key] = append(batch[key], are.ID)
			out[i] = RequestResult{Outcome: "pending", Card: key, Reason: fmt.Sprintf("tier %s needs a human", are.Tier), Took: took}
		default:
			out[i] = RequestResult{Outcome: "denied", Reason: err.Error(), Err: err, Took: took}
		}
	}
	if len(keys) == 0 {
		return out, nil
	}
	cardOf := map[string]*Card{}
	for _, key := range keys {
		var aps []ApprovalRecord
		for _, id := range batch[key] {
			if ap, ok := a.st.Approvals[id]; ok {
				aps = append(aps, *ap)
			} else {
				aps = append(aps, ApprovalRecord{ID: id})
			}
		}
		c := &Card{ID: newCardID(), Session: aps[0].Request.Session, Tier: aps[0].Tier, Created: aps[0].Created, Expires: aps[0].Expires, Status: CardPending}
		for _, ap := range aps {
			c.Items = append(c.Items, itemFor(ap))
		}
		a.st.Cards[c.ID] = c
		cardOf[key] = c
	}
	for i := range out {
		if out[i].Outcome == "pending" {
			out[i].Card = cardOf[out[i].Card].ID
		}
	}
	if err := a.persist(); err != nil {
		return out, err
	}
	for _, key := range keys {
		a.emitCard("card.open", cardOf[key])
	}
	return out, nil
}

// Cards lists the cards, oldest first: the pending ones, or all of them.
func (a *Agent) Cards(all bool) []Card {
	a.mu.Lock()
	defer a.unlock()
	a.syncCards()
	out := []Card{}
	for _, c := range a.st.Cards {
		if all || c.Status == CardPending {
			out = append(out, *c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Card returns one card.
func (a *Agent) Card(id string) (Card, error) {
	a.mu.Lock()
	defer a.unlock()
	a.syncCards()
	c, ok := a.st.Cards[id]
	if !ok {
		return Card{}, fmt.Errorf("%w: %s", ErrUnknownCard, id)
	}
	return *c, nil
}

// ApproveCard approves every request on a pending card on behalf of
// approver: mode once or session sets the grants' lifecycle; pattern is
// session and also approves the same scopes asked again by the session.
// Each item runs the GRANT sequence (its gate again); the results say which
// were granted.
func (a *Agent) ApproveCard(ctx context.Context, id, mode, approver string) (Card, []RequestResult, error) {
	lc := LifecycleSession
	switch mode {
	case "once":
		lc = LifecycleOnce
	case "session", "pattern":
	default:
		return Card{}, nil, fmt.Errorf("%w: mode %q: want once, session or pattern", ErrInvalidRequest, mode)
	}
	a.mu.Lock()
	defer a.unlock()
	a.syncCards()
	c, err := a.pendingCard(id)
	if err != nil {
		return Card{}, nil, err
	}
	results := make([]RequestResult, len(c.Items))
	for i, it := range c.Items {
		g, err := a.approveAsLocked(ctx, it.Approval, approver, lc)
		if err != nil {
			results[i] = RequestResult{Outcome: "denied", Reason: err.Error(), Err: err}
			continue
		}
		results[i] = RequestResult{Outcome: "granted", Grant: g}
		if mode == "pattern" {
			a.st.Patterns[fmt.Sprintf("%s/%d", c.ID, i)] = &Pattern{Card: c.ID, Session: c.Session, Scope: it.Scope, Decider: approver, Created: a.cfg.Now()}
		}
	}
	c.Status, c.Decision, c.Decider = CardApproved, mode, approver
	if err := a.persist(); err != nil {
		return Card{}, nil, err
	}
	a.emitCard("card.approved", c)
	return *c, results, nil
}

// DenyCard records an explicit deny of every request on a pending card (a
// denial for the circuit breaker); CancelCard dismisses it, which is not a
// denial. The requests do not run either way.
func (a *Agent) DenyCard(ctx context.Context, id, actor string) (Card, error) {
	return a.closeCard(id, CardDenied, actor)
}

// CancelCard dismisses a pending card (see DenyCard).
func (a *Agent) CancelCard(ctx context.Context, id, actor string) (Card, error) {
	return a.closeCard(id, CardCancelled, actor)
}

func (a *Agent) closeCard(id, status, actor string) (Card, error) {
	a.mu.Lock()
	defer a.unlock()
	a.syncCards()
	c, err := a.pendingCard(id)
	if err != nil {
		return Card{}, err
	}
	var errs []error
	for _, it := range c.Items {
		var err error
		if status == CardDenied {
			err = a.denyApprovalLocked(it.Approval, actor)
		} else {
			err = a.cancelApprovalLocked(it.Approval, actor)
		}
		if err != nil && !errors.Is(err, ErrUnknownApproval) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Card{}, err
	}
	c.Status, c.Decider = status, actor
	if err := a.persist(); err != nil {
		return Card{}, err
	}
	a.emitCard("card."+status, c)
	return *c, nil
}

// pendingCard returns card id if it is still pending; a.mu held.
func (a *Agent) pendingCard(id string) (*Card, error) {
	c, ok := a.st.Cards[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownCard, id)
	}
	if c.Status != CardPending {
		return nil, fmt.Errorf("%w: %s is %s", ErrCardDecided, id, c.Status)
	}
	return c, nil
}

// emitCard tells the event sink about a card (a copy: the record changes
// later). Card events are notices; a sink error does not undo the decision.
func (a *Agent) emitCard(kind string, c *Card) {
	cp := *c
	a.emit(Event{Kind: kind, Session: c.Session, Tier: c.Tier.String(), Outcome: c.Status, Card: &cp})
	a.askPause(c) // pause.go
}

// syncCards brings the cards in line with the pending approvals: a pending
// card whose approvals are all gone without a decision on the card timed out
// (the sweep expired them, the session ended, or they were decided one by
// one); an approval on no card (an Ask outside Request, such as an
// attenuation into another session) gets a card of its own. It persists what
// changed; a.mu held.
func (a *Agent) syncCards() {
	var timedOut []*Card
	onCard := map[string]bool{}
	changed := false
	for _, c := range a.st.Cards {
		if c.Status != CardPending {
			continue
		}
		live := false
		for _, it := range c.Items {
			if _, ok := a.st.Approvals[it.Approval]; ok {
				live = true
				onCard[it.Approval] = true
			}
		}
		if !live {
			c.Status = CardTimedOut
			timedOut = append(timedOut, c)
			changed = true
		}
	}
	for _, ap := range a.st.Approvals {
		if onCard[ap.ID] {
			continue
		}
		c := &Card{ID: newCardID(), Session: ap.Request.Session, Tier: ap.Tier, Created: ap.Created, Expires: ap.Expires,
			Items: []CardItem{itemFor(*ap)}, Status: CardPending}
		a.st.Cards[c.ID] = c
		changed = true
	}
	if !changed {
		return
	}
	if err := a.persist(); err != nil {
		a.cfg.Logger.Error("save cards", "err", err)
	}
	sort.Slice(timedOut, func(i, j int) bool { return timedOut[i].Created.Before(timedOut[j].Created) })
	for _, c := range timedOut {
		a.emitCard("card.timed_out", c)
	}
}

// matchPattern returns the oldest pattern that pre-approves req; a.mu held.
func (a *Agent) matchPattern(req GrantRequest) (Pattern, bool) {
	want, _ := json.Marshal(req.Capability)
	var best *Pattern
	bestKey := ""
	for k, p := range a.st.Patterns {
		if p.Session != req.Session {
			continue
		}
		if got, _ := json.Marshal(p.Scope); string(got) != string(want) {
			continue
		}
		if best == nil || p.Created.Before(best.Created) || p.Created.Equal(best.Created) && k < bestKey {
			best, bestKey = p, k
		}
	}
	if best == nil {
		return Pattern{}, false
	}
	return *best, true
}

func newCardID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "c-" + hex.EncodeToString(b)
}

func itemFor(ap ApprovalRecord) CardItem {
	return CardItem{
		Approval:   ap.ID,
		Actor:      ap.Request.Requester,
		Action:     "UseCapability",
		Resource:   ap.Request.Capability.Class,
		Scope:      ap.Request.Capability,
		Provenance: ap.Request.Provenance,
		Lifecycle:  ap.Request.Lifecycle,
		Rule:       fmt.Sprintf("tier:%s (class %s, provenance %s)", ap.Tier, ap.Request.Capability.Class, provOr(ap.Request.Provenance)),
		Tier:       ap.Tier,
	}
}

func provOr(p Provenance) string {
	if p == "" {
		return "first-party"
	}
	return string(p)
}

// legacyCardsFile is where the API server kept cards and patterns before
// they moved into the agent's state.
const legacyCardsFile = "cards.json"

// openCards runs at Open: it folds a cards.json left by an older daemon into
// the state (then removes it) and syncs the cards with the approvals.
func (a *Agent) openCards() error {
	a.mu.Lock()
	defer a.unlock()
	path := filepath.Join(a.cfg.StateDir, legacyCardsFile)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("%w: %w", ErrState, err)
	default:
		var legacy struct {
			Cards    map[string]*Card `json:"cards"`
			Patterns []Pattern        `json:"patterns"`
		}
		if err := json.Unmarshal(data, &legacy); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrState, path, err)
		}
		for id, c := range legacy.Cards {
			if _, ok := a.st.Cards[id]; !ok && c != nil {
				a.st.Cards[id] = c
			}
		}
		for i, p := range legacy.Patterns {
			p := p
			a.st.Patterns[fmt.Sprintf("legacy/%06d", i)] = &p
		}
		if err := a.persist(); err != nil {
			return err
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("%w: %w", ErrState, err)
		}
	}
	a.syncCards()
	return nil
}
