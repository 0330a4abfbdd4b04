package memory

import (
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// deny counts a denial against s (index 0 when nil) and reports it; b.mu
// held.
func (b *Backend) deny(s *session, why backend.Reason, proto backend.Proto, dst netip.AddrPort) {
	e := backend.Event{Time: b.cfg.Now(), Reason: why, Proto: proto, Dst: dst, Comm: "memory"}
	idx := uint32(0)
	if s != nil {
		idx, e.Session, e.CgroupID = s.Index, s.Index, s.CgroupID
	}
	c := b.counters[idx]
	if c == nil {
		c = &backend.Denials{}
		b.counters[idx] = c
	}
	c[why]++
	b.events.publish(e)
}

// Counters returns the denials counted against session index (index 0:
// what no session owns). A session's counts start at zero when it is
// created.
func (b *Backend) Counters(index uint32) (backend.Denials, error) {
	if index >= b.cfg.MaxSessions {
		return backend.Denials{}, fmt.Errorf("%w: index %d", backend.ErrSessionNotFound, index)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.counters[index]; c != nil {
		return *c, nil
	}
	return backend.Denials{}, nil
}

// RingbufDrops counts the denial events no reader had room for (the
// counters still counted them).
func (b *Backend) RingbufDrops() (uint64, error) { return b.events.drops.Load(), nil }

// SweepStats counts the modelled sweeps (one per revoke write; nothing to
// destroy).
func (b *Backend) SweepStats() backend.SweepStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sweeps
}

// Ops counts the revoke writes and sweeps since New. The model has no
// follow-up sweeps.
func (b *Backend) Ops() backend.Ops {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ops
}

// Occupancy reports the tables' fill, named as the Linux backend names its
// maps.
func (b *Backend) Occupancy() []backend.Occupancy {
	b.mu.Lock()
	defer b.mu.Unlock()
	return []backend.Occupancy{
		{Map: "sessions", Entries: len(b.sessions), Limit: int(b.cfg.MaxSessions) - 1},
		{Map: "handles", Entries: b.slots.inUse(), Limit: int(b.cfg.MaxHandles) - 1},
		{Map: "egress4", Entries: b.nEntries[0], Limit: b.cfg.MaxEgress4},
		{Map: "exact4", Entries: b.nEntries[1], Limit: b.cfg.MaxEgress4},
		{Map: "egress6", Entries: b.nEntries[2], Limit: b.cfg.MaxEgress6},
		{Map: "exact6", Entries: b.nEntries[3], Limit: b.cfg.MaxEgress6},
	}
}

// Events opens a reader of denial events. Like the kernel's ring buffer,
// the events wait in one bounded buffer whether or not a reader is open,
// each is read once (by whichever reader reads first), and one that finds
// the buffer full is dropped and counted (RingbufDrops).
func (b *Backend) Events() (backend.EventReader, error) {
	return &eventReader{hub: &b.events, done: make(chan struct{}), wake: make(chan struct{})}, nil
}

// eventHub is the model's event ring.
type eventHub struct {
	ch        chan backend.Event
	drops     atomic.Uint64
	closed    chan struct{}
	closeOnce sync.Once
}

func (h *eventHub) init(size int) {
	h.ch = make(chan backend.Event, size)
	h.closed = make(chan struct{})
}

func (h *eventHub) publish(e backend.Event) {
	select {
	case h.ch <- e:
	default:
		h.drops.Add(1)
	}
}

func (h *eventHub) closeAll() { h.closeOnce.Do(func() { close(h.closed) }) }

// eventReader reads the hub until its Close, the backend's Close or its
// deadline.
type eventReader struct {
	hub       *eventHub
	done      chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	deadline time.Time
	wake     chan struct{} // closed (and replaced) when the deadline changes
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t (zero: no
// deadline), a Read already waiting included.
func (r *eventReader) SetDeadline(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deadline = t
	close(r.wake)
	r.wake = make(chan struct{})
}

// Read returns the next event; os.ErrClosed after Close, os.ErrDeadlineExceeded
// once the deadline passed with nothing to read.
func (r *eventReader) Read() (backend.Event, error) {
	for {
		r.mu.Lock()
		dl, wake := r.deadline, r.wake
		r.mu.Unlock()
		select {
		case <-r.done:
			return backend.Event{}, os.ErrClosed
		case <-r.hub.closed:
			return backend.Event{}, os.ErrClosed
		default:
		}
		var (
			timer   *time.Timer
			timeout <-chan time.Time
		)
		if !dl.IsZero() {
			d := time.Until(dl)
			if d <= 0 {
				select {
				case e := <-r.hub.ch:
					return e, nil
				default:
					return backend.Event{}, os.ErrDeadlineExceeded
				}
			}
			timer = time.NewTimer(d)
			timeout = timer.C
		}
		e, err, again := r.wait(wake, timeout)
		if timer != nil {
			timer.Stop()
		}
		if !again {
			return e, err
		}
	}
}

// wait is one wait of Read; again: the deadline changed.
func (r *eventReader) wait(wake <-chan struct{}, timeout <-chan time.Time) (backend.Event, error, bool) {
	select {
	case e := <-r.hub.ch:
		return e, nil, false
	case <-r.done:
		return backend.Event{}, os.ErrClosed, false
	case <-r.hub.closed:
		return backend.Event{}, os.ErrClosed, false
	case <-wake:
		return backend.Event{}, nil, true
	case <-timeout:
		return backend.Event{}, os.ErrDeadlineExceeded, false
	}
}

// Close ends the reader; a Read waiting returns os.ErrClosed.
func (r *eventReader) Close() error {
	r.closeOnce.Do(func() { close(r.done) })
	return nil
}
