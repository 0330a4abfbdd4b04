package dnsresolver

import (
	"sync"
	"sync/atomic"
)

// DecideFunc is the agent's use-time decision, asked by the full path for
// every name a session's policy allows (the question name, then each CNAME
// target) before anything goes upstream for it or any entry is written: may
// session connect to name on port? rule names the rule that decided (for
// the agent, the Cedar policy id: an admin or hard-deny forbid, a grant, or
// "default-deny"). It is called without any resolver lock held and may
// block briefly; it must be safe for concurrent use.
//
// The resolver knows each matching grant's port range, not the port the
// client will use: it asks once per distinct range, with the range's first
// port (0 for a grant on every port), and writes entries only for the grants
// whose range was allowed. A forbid naming the name (or no port) is honoured
// exactly; one that names only some ports inside a grant's range is not seen
// by the resolver (the kernel entries carry the whole range).
type DecideFunc func(session, name string, port uint16) (allowed bool, rule string)

// decider holds the decision hook, its generation (the fast path answers
// from a prepared reply only while the generation it was prepared under is
// the current one) and the answers it gave: one per session, name and port,
// valid while the session's compiled policy (replaced by every SetPolicy and
// RemovePolicy) and the generation are the ones it was asked under, so a
// name is asked once per policy, not once per query (retries, A and AAAA,
// TCP).
type decider struct {
	f   atomic.Pointer[DecideFunc]
	gen atomic.Uint64

	mu   sync.RWMutex
	memo map[string]map[decKey]decAnswer // session -> its answers
	n    int                             // answers in memo
}

type decKey struct {
	name string
	port uint16
}

type decAnswer struct {
	pol  *compiledPolicy
	gen  uint64
	ok   bool
	rule string
}

// decMemoSize bounds the remembered answers; when full, the answers of the
// sessions holding the most are dropped (share.go), which only costs them
// asking again.
const decMemoSize = 1 << 14

func (d *decider) get(session string, k decKey) (decAnswer, bool) {
	d.mu.RLock()
	a, ok := d.memo[session][k]
	d.mu.RUnlock()
	return a, ok
}

func (d *decider) put(session string, k decKey, a decAnswer) {
	d.mu.Lock()
	if d.memo == nil {
		d.memo = map[string]map[decKey]decAnswer{}
	}
	m := d.memo[session]
	if _, had := m[k]; !had && d.n >= decMemoSize {
		for _, s := range largestFirst(d.memo, func(m map[decKey]decAnswer) int { return len(m) }, d.n, roomFor(decMemoSize)) {
			d.n -= len(d.memo[s])
			delete(d.memo, s)
		}
		m = d.memo[session] // perhaps this session's: then gone
	}
	if m == nil {
		m = map[decKey]decAnswer{}
		d.memo[session] = m
	}
	if _, had := m[k]; !had {
		d.n++
	}
	m[k] = a
	d.mu.Unlock()
}

// forget drops a session's answers (they would not match its new policy
// anyway; this frees them and the policies they hold): the session's, not
// a walk of every session's.
func (d *decider) forget(session string) {
	d.mu.Lock()
	d.n -= len(d.memo[session])
	delete(d.memo, session)
	d.mu.Unlock()
}

// SetDecide gives the resolver the use-time decision it asks for every name
// its policies allow (nil: none, the policies alone decide). Every prepared
// reply and remembered answer is invalidated.
func (r *Resolver) SetDecide(f DecideFunc) {
	if f == nil {
		r.dec.f.Store(nil)
	} else {
		r.dec.f.Store(&f)
	}
	r.dec.gen.Add(1)
}

// DecisionsChanged says that what the decision answers may have changed
// (the agent's policy set was replaced): from now on no query is answered
// from a reply prepared, or an answer given, under an earlier decision; each
// name is asked again by the full path. Grant and session changes need no
// call: they come with SetPolicy or RemovePolicy, which void the session's
// replies and answers anyway.
func (r *Resolver) DecisionsChanged() { r.dec.gen.Add(1) }

// decideGrants asks the decision (or finds its answer under pol and dgen,
// the generation read before asking) for name under each distinct port
// range of grants, and returns the grants whose range was allowed; when none
// is, rule is the rule of the first denial. Without a hook every grant
// stays.
func (r *Resolver) decideGrants(session, name string, pol *compiledPolicy, dgen uint64, grants []*compiledGrant) (kept []*compiledGrant, rule string) {
	f := r.dec.f.Load()
	if f == nil {
		return grants, ""
	}
	ask := func(port uint16) (bool, string) {
		k := decKey{name, port}
		if a, ok := r.dec.get(session, k); ok && a.pol == pol && a.gen == dgen {
			return a.ok, a.rule
		}
		ok, why := (*f)(session, name, port)
		r.dec.put(session, k, decAnswer{pol: pol, gen: dgen, ok: ok, rule: why})
		return ok, why
	}
	all := true
	for _, g := range grants {
		if ok, why := ask(g.Ports.Lo); !ok {
			all = false
			if rule == "" {
				rule = why
			}
		}
	}
	if all {
		return grants, ""
	}
	for _, g := range grants {
		if ok, _ := ask(g.Ports.Lo); ok {
			kept = append(kept, g)
		}
	}
	if len(kept) > 0 {
		rule = ""
	}
	return kept, rule
}
