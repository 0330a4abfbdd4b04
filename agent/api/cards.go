package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

// CardItem is one paused request on a card.
type CardItem struct {
	Approval   string           `json:"approval"` // the agent's pending approval id
	Actor      string           `json:"actor"`    // who asked (agent id / model version)
	Action     string           `json:"action"`   // always "UseCapability" for now
	Resource   agent.Class      `json:"resource"`
	Scope      agent.Capability `json:"scope"`
	Provenance agent.Provenance `json:"provenance"`
	Lifecycle  agent.Lifecycle  `json:"lifecycle"`
	Rule       string           `json:"rule"` // the tier rule that fired
	Tier       agent.Tier       `json:"tier"`
}

// Card is an approval card (seeds/permissions.md §6.3): sibling requests of
// one session and one tier, decided together.
type Card struct {
	ID      string     `json:"id"`
	Session string     `json:"session"`
	Tier    agent.Tier `json:"tier"`
	Created time.Time  `json:"created"`
	Expires time.Time  `json:"expires"`
	Items   []CardItem `json:"items"`
	// Status: pending, approved, denied (an explicit no), cancelled (a
	// dismissal), timed_out (nobody answered: the actions did not run).
	Status   string `json:"status"`
	Decision string `json:"decision,omitempty"` // once | session | pattern
	Decider  string `json:"decider,omitempty"`
}

// Pattern is an "approve this pattern" decision: the same capability scope
// asked again by the same session is approved without a new card.
type Pattern struct {
	Card    string           `json:"card"`
	Session string           `json:"session"`
	Scope   agent.Capability `json:"scope"`
	Decider string           `json:"decider"`
}

// cardStore keeps cards and patterns durable (cards.json in the state dir,
// replaced atomically), so they survive a restart or a kill -9.
type cardStore struct {
	mu       sync.Mutex
	path     string
	Cards    map[string]*Card `json:"cards"`
	Patterns []Pattern        `json:"patterns"`
}

func openCards(stateDir string) (*cardStore, error) {
	s := &cardStore{path: filepath.Join(stateDir, "cards.json"), Cards: map[string]*Card{}}
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read cards: %w", err)
	}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("read cards %s: %w", s.path, err)
	}
	if s.Cards == nil {
		s.Cards = map[string]*Card{}
	}
	return s, nil
}

// save writes the store; s.mu held.
func (s *cardStore) save() error {
	data, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("save cards: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("save cards: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("save cards: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save cards: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("save cards: %w", err)
	}
	if d, err := os.Open(filepath.Dir(s.path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

func newCardID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "c-" + hex.EncodeToString(b)
}

// sync reconciles cards with the agent's pending approvals: a pending card
// whose approvals are all gone without a decision timed out (the agent's
// sweep removed them); an approval on no card gets a card of its own.
// s.mu held.
func (s *cardStore) sync(pending []agent.ApprovalRecord) (changed []*Card) {
	live := map[string]agent.ApprovalRecord{}
	for _, ap := range pending {
		live[ap.ID] = ap
	}
	onCard := map[string]bool{}
	for _, c := range s.Cards {
		if c.Status != "pending" {
			continue
		}
		any := false
		for _, it := range c.Items {
			if _, ok := live[it.Approval]; ok {
				any = true
				onCard[it.Approval] = true
			}
		}
		if !any {
			c.Status = "timed_out"
			changed = append(changed, c)
		}
	}
	for _, ap := range pending {
		if onCard[ap.ID] {
			continue
		}
		c := &Card{ID: newCardID(), Session: ap.Request.Session, Tier: ap.Tier, Created: ap.Created, Expires: ap.Expires,
			Items: []CardItem{itemFor(ap)}, Status: "pending"}
		s.Cards[c.ID] = c
		changed = append(changed, c)
	}
	return changed
}

func itemFor(ap agent.ApprovalRecord) CardItem {
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

func provOr(p agent.Provenance) string {
	if p == "" {
		return "first-party"
	}
	return string(p)
}

func (s *cardStore) list() []*Card {
	out := make([]*Card, 0, len(s.Cards))
	for _, c := range s.Cards {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// matchPattern returns the pattern that pre-approves req, if any.
func (s *cardStore) matchPattern(req agent.GrantRequest) (Pattern, bool) {
	want, _ := json.Marshal(req.Capability)
	for _, p := range s.Patterns {
		got, _ := json.Marshal(p.Scope)
		if p.Session == req.Session && string(got) == string(want) {
			return p, true
		}
	}
	return Pattern{}, false
}
