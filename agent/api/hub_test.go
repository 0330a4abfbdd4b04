package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

// TestHubEncoding: every record read from the hub, kept or followed,
// carries its value as JSON, whether it was encoded at publish (a card
// event, any other value) or kept as a value until read (an agent event
// without a card); the ring keeps the last n, oldest first.
func TestHubEncoding(t *testing.T) {
	h := NewHub(3)
	ch, cancel := h.Subscribe()
	deny := agent.Event{Time: time.Unix(1700000000, 0).UTC(), Kind: agent.EventUseDenied, Session: "s1", Class: agent.ClassNetEgress, Outcome: "denied", Rule: "default-deny"}
	card := agent.Event{Kind: "card.open", Session: "s1", Card: &agent.Card{ID: "c1", Session: "s1"}}
	vals := []any{map[string]any{"x": 1}, deny, card, deny}
	h.Publish("api", "first", vals[0])
	h.Publish("agent", "deny", vals[1])
	cancel() // the rest are published with no subscriber
	h.Publish("agent", "card", vals[2])
	h.Publish("agent", "deny", vals[3])

	want := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i, v := range vals[:2] {
		r := (<-ch).encoded() // as the events stream does
		if string(r.Data) != want(v) {
			t.Errorf("followed record %d: %s, want %s", i, r.Data, want(v))
		}
	}
	got := h.Recent()
	if len(got) != 3 {
		t.Fatalf("%d records kept, want 3", len(got))
	}
	for i, v := range vals[1:] {
		if string(got[i].Data) != want(v) {
			t.Errorf("kept record %d: %s, want %s", i, got[i].Data, want(v))
		}
		b, err := json.Marshal(got[i])
		if err != nil || !json.Valid(b) {
			t.Errorf("kept record %d does not encode: %v", i, err)
		}
	}
}
