package dnsresolver

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/shinken-agent/shinken/agent/backend"
)

const memoSize = 1 << 16

type memoKey struct {
	prefix netip.Prefix
	proto  backend.Proto
	ports  backend.PortRange
	handle backend.HandleRef
}

// writeMemo remembers, per session and rule (expiry aside), the latest
// expiry this resolver wrote with AllowEgress. A rule whose entry already
// lasts at least as long is not written again: a cached answer costs no map
// write, and an answer with a shorter TTL for the same address (two names
// of one CDN address) never shortens the entry another name's answer still
// relies on. It is bounded: when full, the sessions holding the most are
// forgotten (share.go), which only costs them extra writes. A nil
// memo remembers nothing.
//
// Each session's part has a generation that changes whenever anything of
// it is dropped (forget, or dropped when full): while it stays the same,
// whatever has held for the session stays true, since add only ever
// lengthens an expiry. The fast path's prepared replies check it, so one
// session's end (or flood of writes) voids that session's replies only.
type writeMemo struct {
	mu  sync.RWMutex
	max int
	n   int // entries held, every session's
	s   map[string]*sessionWrites
	seq atomic.Uint64 // generations are drawn from it: never the same twice, never 0
}

// sessionWrites is one session's part of the memo.
type sessionWrites struct {
	m   map[memoKey]int64 // expiry, Unix ns
	gen uint64
}

func newWriteMemo(max int) *writeMemo {
	return &writeMemo{max: max, s: make(map[string]*sessionWrites)}
}

func key(r backend.EgressRule) memoKey {
	return memoKey{r.Prefix, r.Proto, r.Ports, r.Handle}
}

// has reports whether the rule's entry is known to last until r.Expires.
func (w *writeMemo) has(session string, r backend.EgressRule) bool {
	if w == nil {
		return false
	}
	w.mu.RLock()
	var exp int64
	ok := false
	if sw := w.s[session]; sw != nil {
		exp, ok = sw.m[key(r)]
	}
	w.mu.RUnlock()
	return ok && exp >= r.Expires.UnixNano()
}

func (w *writeMemo) add(session string, r backend.EgressRule) {
	if w == nil {
		return
	}
	k := key(r)
	w.mu.Lock()
	defer w.mu.Unlock()
	sw := w.s[session]
	had := false
	if sw != nil {
		_, had = sw.m[k]
	}
	if !had {
		if w.n >= w.max {
			w.dropLargestLocked() // perhaps this session's: sw is then gone
		}
		sw = w.partLocked(session)
		w.n++
		sw.m[k] = r.Expires.UnixNano()
		return
	}
	sw.m[k] = max(sw.m[k], r.Expires.UnixNano())
}

// dropLargestLocked makes room (w.mu held): it forgets the sessions holding
// the most (share.go).
func (w *writeMemo) dropLargestLocked() {
	for _, name := range largestFirst(w.s, func(sw *sessionWrites) int { return len(sw.m) }, w.n, roomFor(w.max)) {
		w.n -= len(w.s[name].m)
		delete(w.s, name)
	}
}

// gen is session's generation in the memo (see writeMemo); 0 for a nil
// memo. A session the memo holds nothing of gets its part here, with a
// generation never given before, so that the generation a reply was
// prepared under is the one its entries were added under (add keeps it) and
// any drop since shows.
func (w *writeMemo) gen(session string) uint64 {
	if w == nil {
		return 0
	}
	w.mu.RLock()
	sw := w.s[session]
	w.mu.RUnlock()
	if sw != nil {
		return sw.gen
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.partLocked(session).gen
}

// current is session's generation if the memo holds a part for it, 0
// otherwise (never a generation gen gives): for checking a prepared reply,
// without making a part.
func (w *writeMemo) current(session string) uint64 {
	if w == nil {
		return 0
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if sw := w.s[session]; sw != nil {
		return sw.gen
	}
	return 0
}

// partLocked is session's part, made if it has none (w.mu held).
func (w *writeMemo) partLocked(session string) *sessionWrites {
	sw := w.s[session]
	if sw == nil {
		sw = &sessionWrites{m: make(map[memoKey]int64), gen: w.seq.Add(1)}
		w.s[session] = sw
	}
	return sw
}

// forget drops what was written for session.
func (w *writeMemo) forget(session string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	if sw := w.s[session]; sw != nil {
		w.n -= len(sw.m)
		delete(w.s, session)
	}
	w.mu.Unlock()
}
