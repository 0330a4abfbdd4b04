package dnsresolver

import (
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

// decider holds the decision hook and its generation: the fast path answers
// from a prepared reply only while the generation it was prepared under is
// the current one.
type decider struct {
	f   atomic.Pointer[DecideFunc]
	gen atomic.Uint64
}

// SetDecide gives the resolver the use-time decision it asks for every name
// its policies allow (nil: none, the policies alone decide). Every prepared
// reply is invalidated.
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
// from a reply prepared under an earlier decision; each name is asked again
// by the full path. Grant and session changes need no call: they come with
// SetPolicy or RemovePolicy, which invalidate the session's replies anyway.
func (r *Resolver) DecisionsChanged() { r.dec.gen.Add(1) }

// decideGrants asks the decision for name under each distinct port range of
// grants and returns the grants whose range was allowed; when none is, rule
// is the rule of the first denial. Without a hook every grant stays.
func (r *Resolver) decideGrants(session, name string, grants []*compiledGrant) (kept []*compiledGrant, rule string) {
	f := r.dec.f.Load()
	if f == nil {
		return grants, ""
	}
	type answer struct {
		ok   bool
		rule string
	}
	var asked [4]struct {
		port uint16
		a    answer
	}
	n := 0
	var extra map[uint16]answer
	ask := func(port uint16) answer {
		for i := range min(n, len(asked)) {
			if asked[i].port == port {
				return asked[i].a
			}
		}
		if a, ok := extra[port]; ok {
			return a
		}
		ok, why := (*f)(session, name, port)
		a := answer{ok, why}
		if n < len(asked) {
			asked[n].port, asked[n].a = port, a
		} else {
			if extra == nil {
				extra = map[uint16]answer{}
			}
			extra[port] = a
		}
		n++
		return a
	}
	all := true
	for _, g := range grants {
		if a := ask(g.Ports.Lo); !a.ok {
			all = false
			if rule == "" {
				rule = a.rule
			}
		}
	}
	if all {
		return grants, ""
	}
	for _, g := range grants {
		if ask(g.Ports.Lo).ok {
			kept = append(kept, g)
		}
	}
	if len(kept) > 0 {
		rule = ""
	}
	return kept, rule
}
