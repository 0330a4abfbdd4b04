package api

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

// Record is one entry of the event stream: an agent lifecycle event or a
// kernel denial.
type Record struct {
	Time   time.Time       `json:"time"`
	Source string          `json:"source"` // "agent" | "kernel" | "api"
	Kind   string          `json:"kind"`
	Data   json.RawMessage `json:"data"`

	// value is Data not yet encoded: an agent event without a card (only
	// value fields, so a copy cannot change) is kept as is and encoded
	// by its reader (Recent, or a follower's encoded()), never on the
	// publisher's path. A use-time denial answered at /v1/decide publishes
	// one, and most are never read.
	value *agent.Event
}

// encoded returns r with Data set; followers call it on what Subscribe
// delivers.
func (r Record) encoded() Record {
	if r.value != nil {
		r.Data, _ = json.Marshal(r.value)
		r.value = nil
	}
	return r
}

// Hub fans records out to event-stream subscribers and keeps the most recent
// ones for a plain (non-following) read. A slow subscriber loses records
// (counted) rather than slowing the agent down.
type Hub struct {
	mu      sync.Mutex
	recent  []Record
	next    int
	full    bool
	subs    map[chan Record]struct{}
	dropped uint64
}

// NewHub keeps the last n records.
func NewHub(n int) *Hub {
	return &Hub{recent: make([]Record, n), subs: map[chan Record]struct{}{}}
}

// Publish adds a record.
func (h *Hub) Publish(source, kind string, v any) {
	r := Record{Time: time.Now().UTC(), Source: source, Kind: kind}
	if e, ok := v.(agent.Event); ok && e.Card == nil {
		r.value = &e
	} else {
		data, err := json.Marshal(v)
		if err != nil {
			return
		}
		r.Data = data
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recent[h.next] = r
	h.next = (h.next + 1) % len(h.recent)
	if h.next == 0 {
		h.full = true
	}
	for ch := range h.subs {
		select {
		case ch <- r:
		default:
			h.dropped++
		}
	}
}

// Recent returns the kept records, oldest first.
func (h *Hub) Recent() []Record {
	h.mu.Lock()
	var out []Record
	if h.full {
		out = append(out, h.recent[h.next:]...)
	}
	out = append(out, h.recent[:h.next]...)
	h.mu.Unlock()
	for i := range out {
		out[i] = out[i].encoded()
	}
	return out
}

// Subscribe returns a channel of new records (Data set by encoded); call
// the cancel func when done.
func (h *Hub) Subscribe() (<-chan Record, func()) {
	ch := make(chan Record, 1024)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}
