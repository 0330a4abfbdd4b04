package dnsresolver

import (
	"net/netip"
	"sync"

	"github.com/shinken-agent/shinken/dataplane"
)

const memoSize = 1 << 16

type memoKey struct {
	session string
	prefix  netip.Prefix
	proto   dataplane.Proto
	ports   dataplane.PortRange
	handle  dataplane.HandleRef
	expires int64
}

// writeMemo remembers rules written with AllowEgress, expiry included, so a
// cached answer (same rule, same expiry) does not write it again. It is
// bounded: when full it is emptied, which only costs extra writes. A nil
// memo remembers nothing.
type writeMemo struct {
	mu  sync.RWMutex
	max int
	m   map[memoKey]struct{}
}

func newWriteMemo(max int) *writeMemo {
	return &writeMemo{max: max, m: make(map[memoKey]struct{})}
}

func key(session string, r dataplane.EgressRule) memoKey {
	return memoKey{session, r.Prefix, r.Proto, r.Ports, r.Handle, r.Expires.UnixNano()}
}

func (w *writeMemo) has(session string, r dataplane.EgressRule) bool {
	if w == nil {
		return false
	}
	k := key(session, r)
	w.mu.RLock()
	_, ok := w.m[k]
	w.mu.RUnlock()
	return ok
}

func (w *writeMemo) add(session string, r dataplane.EgressRule) {
	if w == nil {
		return
	}
	k := key(session, r)
	w.mu.Lock()
	if len(w.m) >= w.max {
		clear(w.m)
	}
	w.m[k] = struct{}{}
	w.mu.Unlock()
}

// forget drops what was written for session.
func (w *writeMemo) forget(session string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	for k := range w.m {
		if k.session == session {
			delete(w.m, k)
		}
	}
	w.mu.Unlock()
}
