package dnsresolver

import (
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// link is one CNAME link of a chain.
type link struct {
	owner, target string // canonical
	expires       time.Time
}

// addrRec is one A or AAAA record at the end of the chain.
type addrRec struct {
	addr    netip.Addr
	expires time.Time
}

// result is an upstream answer reduced to what the resolver serves: the
// CNAME chain from the question name, the addresses (or passthrough records)
// owned by its last name, and the rcode. It holds no session data, so it is
// shared by every session through the cache; policy is applied per query.
type result struct {
	rcode   int // dns.RcodeSuccess or dns.RcodeNameError
	chain   []link
	final   string // last name of the chain (the question name if no chain)
	addrs   []addrRec
	other   []dns.RR // passthrough records, TTL rewritten at answer time
	otherEx []time.Time
	expires time.Time // the earliest record expiry: the cache entry dies then
}

type cacheKey struct {
	name  string
	qtype uint16
}

// cache is the shared answer cache: a bounded map whose entries each
// remember the session whose query fetched them. Expired entries are
// skipped on lookup; when full, it drops the expired ones, then, if that
// is not room enough, the entries fetched by the sessions holding the most
// (share.go): a session flooding distinct names evicts its own answers,
// not the ones other sessions rely on.
type cache struct {
	mu      sync.RWMutex
	max     int
	m       map[cacheKey]cached
	byOwner map[string]map[cacheKey]struct{} // session -> the keys it fetched
}

type cached struct {
	res   *result
	owner string
}

func newCache(max int) *cache {
	if max <= 0 {
		return nil
	}
	return &cache{max: max, m: make(map[cacheKey]cached), byOwner: make(map[string]map[cacheKey]struct{})}
}

func (c *cache) get(k cacheKey, now time.Time) *result {
	if c == nil {
		return nil
	}
	c.mu.RLock()
	r := c.m[k].res
	c.mu.RUnlock()
	if r == nil || !now.Before(r.expires) {
		return nil
	}
	return r
}

// put caches r under k, fetched by session owner's query.
func (c *cache) put(k cacheKey, r *result, owner string, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, had := c.m[k]
	if !had && len(c.m) >= c.max {
		c.makeRoomLocked(now)
	}
	if had {
		c.disownLocked(k, old.owner)
	}
	c.m[k] = cached{r, owner}
	keys := c.byOwner[owner]
	if keys == nil {
		keys = make(map[cacheKey]struct{})
		c.byOwner[owner] = keys
	}
	keys[k] = struct{}{}
}

// makeRoomLocked brings a full cache to three quarters (c.mu held).
func (c *cache) makeRoomLocked(now time.Time) {
	keep := roomFor(c.max)
	for k, e := range c.m {
		if !now.Before(e.res.expires) {
			delete(c.m, k)
			c.disownLocked(k, e.owner)
		}
	}
	for _, owner := range largestFirst(c.byOwner, func(keys map[cacheKey]struct{}) int { return len(keys) }, len(c.m), keep) {
		for k := range c.byOwner[owner] {
			delete(c.m, k)
		}
		delete(c.byOwner, owner)
	}
}

// disownLocked drops k from owner's keys (c.mu held).
func (c *cache) disownLocked(k cacheKey, owner string) {
	keys := c.byOwner[owner]
	delete(keys, k)
	if len(keys) == 0 {
		delete(c.byOwner, owner)
	}
}

// flight runs one function per key at a time; callers that arrive while it
// runs wait for its result instead of running it again.
type flight struct {
	mu sync.Mutex
	m  map[cacheKey]*flightCall
}

type flightCall struct {
	done chan struct{}
	res  *result
	err  error
}

func (f *flight) do(k cacheKey, fn func() (*result, error)) (*result, error) {
	f.mu.Lock()
	if c, ok := f.m[k]; ok {
		f.mu.Unlock()
		<-c.done
		return c.res, c.err
	}
	if f.m == nil {
		f.m = map[cacheKey]*flightCall{}
	}
	c := &flightCall{done: make(chan struct{})}
	f.m[k] = c
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.m, k)
		f.mu.Unlock()
		close(c.done)
	}()
	c.res, c.err = fn()
	return c.res, c.err
}

// perSession counts something (upstream-bound queries, TCP connections) per
// session index, so that one session cannot take every slot of a global
// limit. Index 0 stands for "no session".
type perSession struct {
	mu  sync.Mutex
	max int
	n   map[uint32]int
}

func newPerSession(max int) *perSession { return &perSession{max: max, n: map[uint32]int{}} }

func (p *perSession) acquire(idx uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[idx] >= p.max {
		return false
	}
	p.n[idx]++
	return true
}

func (p *perSession) release(idx uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[idx]--; p.n[idx] <= 0 {
		delete(p.n, idx)
	}
}
