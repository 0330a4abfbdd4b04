package agent

// Tests of approval cards, on the memory backend (no root, any GOOS).

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestCardsInAgentState: Request batches the Asks of one session and tier
// into one card; cards and approved patterns are records of the agent's own
// state (no second store), so they survive a restart; a pattern answers the
// same scope later without a card; Sweep marks a card whose approvals timed
// out.
func TestCardsInAgentState(t *testing.T) {
	d := memKernel(t)
	dir := t.TempDir()
	now := time.Now()
	clock := func() time.Time { return now }
	events := &eventLog{}
	open := func() *Agent { return openAgent(t, d, dir, func(c *Config) { c.Now = clock; c.Events = events }) }
	a := open()
	mustSession(t, a, SessionSpec{ID: "s1"})
	res, err := a.Request(ctx, []GrantRequest{
		{Session: "s1", Capability: loopEgress("127.0.1.7:80"), Lifecycle: LifecycleSession, Requester: "agent-7"},
		{Session: "s1", Capability: loopEgress("127.0.1.8:80"), Lifecycle: LifecycleSession, Requester: "agent-7"},
		{Session: "s1", Capability: loopEgress("127.0.0.9:80"), Lifecycle: LifecycleSession}, // loopback: Auto
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || res[0].Outcome != "pending" || res[1].Outcome != "pending" || res[0].Card == "" || res[0].Card != res[1].Card || res[2].Outcome != "granted" {
		t.Fatalf("batch: %+v", res)
	}
	card := res[0].Card
	if !slices.Contains(events.kinds(), "card.open") {
		t.Errorf("no card.open event in %v", events.kinds())
	}
	if _, err := os.Stat(filepath.Join(dir, legacyCardsFile)); err == nil {
		t.Errorf("a second card store was written")
	}

	a = open() // the cards are in the state
	cs := a.Cards(false)
	if len(cs) != 1 || cs[0].ID != card || len(cs[0].Items) != 2 || cs[0].Items[0].Actor != "agent-7" || cs[0].Tier != TierAsk {
		t.Fatalf("cards after restart: %+v", cs)
	}
	c, results, err := a.ApproveCard(ctx, card, "pattern", "alice")
	if err != nil || c.Status != CardApproved || c.Decision != "pattern" || len(results) != 2 || results[0].Outcome != "granted" || results[1].Outcome != "granted" {
		t.Fatalf("approve: %+v %+v %v", c, results, err)
	}
	if _, _, err := a.ApproveCard(ctx, card, "once", "alice"); !errors.Is(err, ErrCardDecided) {
		t.Fatalf("approving a decided card: %v", err)
	}
	if _, _, err := a.ApproveCard(ctx, card, "always", "alice"); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("bad mode: %v", err)
	}
	if _, err := a.Card("c-nosuch"); !errors.Is(err, ErrUnknownCard) {
		t.Fatalf("unknown card: %v", err)
	}

	a = open() // the pattern is in the state too
	res, err = a.Request(ctx, []GrantRequest{{Session: "s1", Capability: loopEgress("127.0.1.7:80"), Lifecycle: LifecycleSession}})
	if err != nil || res[0].Outcome != "granted" || res[0].Pattern != card {
		t.Fatalf("request matching the pattern: %+v %v", res, err)
	}
	if n := len(a.Cards(false)); n != 0 {
		t.Fatalf("a pattern-approved request opened a card (%d pending)", n)
	}

	// Nobody answers: the sweep times the approval out and the card with it.
	res, err = a.Request(ctx, []GrantRequest{{Session: "s1", Capability: loopEgress("127.0.1.10:80"), Lifecycle: LifecycleSession}})
	if err != nil || res[0].Outcome != "pending" {
		t.Fatalf("ask: %+v %v", res, err)
	}
	now = now.Add(DefaultApprovalTimeout + time.Second)
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := a.Card(res[0].Card); err != nil || c.Status != CardTimedOut {
		t.Fatalf("unanswered card: %+v %v", c, err)
	}
	if !slices.Contains(events.kinds(), "card.timed_out") {
		t.Errorf("no card.timed_out event in %v", events.kinds())
	}
	if _, err := a.DenyCard(ctx, res[0].Card, "alice"); !errors.Is(err, ErrCardDecided) {
		t.Fatalf("denying a timed-out card: %v", err)
	}

	// Decided cards do not pile up: past the tombstone retention the sweep
	// drops them (for good: not back after a restart); a pending one stays.
	pend, err := a.Request(ctx, []GrantRequest{{Session: "s1", Capability: loopEgress("127.0.1.11:80"), Lifecycle: LifecycleSession}})
	if err != nil || pend[0].Outcome != "pending" {
		t.Fatalf("ask: %+v %v", pend, err)
	}
	now = now.Add(24*time.Hour + time.Minute)
	a.mu.Lock()
	a.st.Approvals[a.st.Cards[pend[0].Card].Items[0].Approval].Expires = now.Add(time.Hour) // still waiting
	a.mu.Unlock()
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range []*Agent{a, open()} {
		all := a.Cards(true)
		if len(all) != 1 || all[0].ID != pend[0].Card || all[0].Status != CardPending {
			t.Fatalf("cards after the retention: %+v, want only the pending card %s", all, pend[0].Card)
		}
	}
	a = open()

	// The pattern dies with its session: a new session reusing the name
	// asks again, also after a restart.
	if err := a.EndSession("s1"); err != nil {
		t.Fatal(err)
	}
	a = open()
	mustSession(t, a, SessionSpec{ID: "s1"})
	res, err = a.Request(ctx, []GrantRequest{{Session: "s1", Capability: loopEgress("127.0.1.7:80"), Lifecycle: LifecycleSession}})
	if err != nil || res[0].Outcome != "pending" || res[0].Pattern != "" {
		t.Fatalf("a new session named like an ended one inherited its pattern: %+v %v", res, err)
	}
}

// TestLegacyCardsFileImported: a cards.json left by a daemon that kept cards
// in the API server is folded into the state at Open, then removed.
func TestLegacyCardsFileImported(t *testing.T) {
	d := memKernel(t)
	dir := t.TempDir()
	legacy := map[string]any{
		"cards":    map[string]*Card{"c-legacy": {ID: "c-legacy", Session: "s1", Tier: TierAsk, Created: time.Now(), Status: CardApproved, Decision: "pattern", Decider: "bob"}},
		"patterns": []Pattern{{Card: "c-legacy", Session: "s1", Scope: loopEgress("127.0.1.7:80"), Decider: "bob"}},
	}
	data, _ := json.Marshal(legacy)
	if err := os.WriteFile(filepath.Join(dir, legacyCardsFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	a := openAgent(t, d, dir)
	if _, err := os.Stat(filepath.Join(dir, legacyCardsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cards.json still there: %v", err)
	}
	if c, err := a.Card("c-legacy"); err != nil || c.Decider != "bob" {
		t.Fatalf("legacy card: %+v %v", c, err)
	}
	mustSession(t, a, SessionSpec{ID: "s1"})
	res, err := a.Request(ctx, []GrantRequest{{Session: "s1", Capability: loopEgress("127.0.1.7:80"), Lifecycle: LifecycleSession}})
	if err != nil || res[0].Outcome != "granted" || res[0].Pattern != "c-legacy" {
		t.Fatalf("request matching the legacy pattern: %+v %v", res, err)
	}
}
