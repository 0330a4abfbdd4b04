package api

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

// entry is a record as the hub keeps it. value is Data not yet encoded:
// an agent event without a card (only value fields, so a copy cannot
// change) is kept as is and encoded by its reader (Recent, or a follower's
// encoded()), never on the publisher's path. A use-time denial answered at
// /v1/decide publishes one, and most are never read.
type entry struct {
	Record
	value *agent.Event
}

// encoded returns the record with Data set; followers call it on what
// Subscribe delivers.
func (e entry) encoded() Record {
	if e.value != nil {
		e.Data, _ = json.Marshal(e.value)
	}
	return e.Record
}

// Hub fans records out to event-stream subscribers and keeps the most recent
// ones for a plain (non-following) read. A slow subscriber loses records
// (counted) rather than slowing the agent down.
type Hub struct {
	mu      sync.Mutex
	recent  []entry
	next    int
	full    bool
	subs    map[chan entry]struct{}
	dropped uint64
}

// NewHub keeps the last n records.
func NewHub(n int) *Hub {
	return &Hub{recent: make([]entry, n), subs: map[chan entry]struct{}{}}
}

// Publish adds a record.
func (h *Hub) Publish(source, kind string, v any) {
	r := entry{Record: Record{Time: time.Now().UTC(), Source: source, Kind: kind}}
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
	var kept []entry
	if h.full {
		kept = append(kept, h.recent[h.next:]...)
	}
	kept = append(kept, h.recent[:h.next]...)
	h.mu.Unlock()
	out := make([]Record, len(kept))
	for i, e := range kept {
		out[i] = e.encoded()
	}
	return out
}

// Subscribe returns a channel of new records (a follower sets Data with
// encoded); call the cancel func when done.
func (h *Hub) Subscribe() (<-chan entry, func()) {
	ch := make(chan entry, 1024)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}
