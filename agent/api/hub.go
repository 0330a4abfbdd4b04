package api

import (
	"encoding/json"
	"sync"
	"time"
)

// Record is one entry of the event stream: an agent lifecycle event or a
// kernel denial.
type Record struct {
	Time   time.Time       `json:"time"`
	Source string          `json:"source"` // "agent" | "kernel" | "api"
	Kind   string          `json:"kind"`
	Data   json.RawMessage `json:"data"`
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
	data, err := json.Marshal(v)
	if err != nil {
		return
	}
	r := Record{Time: time.Now().UTC(), Source: source, Kind: kind, Data: data}
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
	defer h.mu.Unlock()
	var out []Record
	if h.full {
		out = append(out, h.recent[h.next:]...)
	}
	return append(out, h.recent[:h.next]...)
}

// Subscribe returns a channel of new records; call the cancel func when done.
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
