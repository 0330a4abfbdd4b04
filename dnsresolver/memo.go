package dnsresolver

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/shinken-agent/shinken/agent/backend"
)

const memoSize = 1 << 16

type memoKey struct {
	session string
	prefix  netip.Prefix
	proto   backend.Proto
	ports   backend.PortRange
	handle  backend.HandleRef
}

// writeMemo remembers, per rule (expiry aside), the latest expiry this
// resolver wrote with AllowEgress. A rule whose entry already lasts at least
// as long is not written again: a cached answer costs no map write, and an
// answer with a shorter TTL for the same address (two names of one CDN
// address) never shortens the entry another name's answer still relies on.
// It is bounded: when full it is emptied, which only costs extra writes. A
// nil memo remembers nothing.
type writeMemo struct {
	mu  sync.RWMutex
	max int
	m   map[memoKey]int64 // expiry, Unix ns
	// g changes whenever anything is dropped (forget, or emptied when
	// full): while it stays the same, whatever has held stays true, since
	// add only ever lengthens an expiry.
	g atomic.Uint64
}

func newWriteMemo(max int) *writeMemo {
	return &writeMemo{max: max, m: make(map[memoKey]int64)}
}

func key(session string, r backend.EgressRule) memoKey {
	return memoKey{session, r.Prefix, r.Proto, r.Ports, r.Handle}
}

// has reports whether the rule's entry is known to last until r.Expires.
func (w *writeMemo) has(session string, r backend.EgressRule) bool {
	if w == nil {
		return false
	}
	k := key(session, r)
	w.mu.RLock()
	exp, ok := w.m[k]
	w.mu.RUnlock()
	return ok && exp >= r.Expires.UnixNano()
}

func (w *writeMemo) add(session string, r backend.EgressRule) {
	if w == nil {
		return
	}
	k := key(session, r)
	w.mu.Lock()
	if len(w.m) >= w.max {
		clear(w.m)
		w.g.Add(1)
	}
	w.m[k] = max(w.m[k], r.Expires.UnixNano())
	w.mu.Unlock()
}

// gen is the memo's generation (see g); 0 for a nil memo.
func (w *writeMemo) gen() uint64 {
	if w == nil {
		return 0
	}
	return w.g.Load()
}

// forget drops what was written for session.
func (w *writeMemo) forget(session string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.g.Add(1)
	for k := range w.m {
		if k.session == session {
			delete(w.m, k)
		}
	}
	w.mu.Unlock()
}
