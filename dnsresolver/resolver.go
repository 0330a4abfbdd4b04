package dnsresolver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Resolver is the allowlisting resolver. Create it with New, give it
// per-session policies with SetPolicy, serve with Start, stop with Close.
// Its methods are safe for concurrent use.
type Resolver struct {
	cfg    Config
	log    *slog.Logger
	up     exchanger
	fwd    *forwarder // the network exchanger, closed by Close
	flight flight     // one upstream query per name and type at a time
	cache  *cache
	stats  stats
	limits *limits    // per-session token buckets (limit.go)
	host   *HostAddrs // the host's own addresses (hostaddr.go)
	watch  bool       // Start watches host (Config.HostAddrs was nil)
	box    penaltyBox // flooding sessions (penalty.go)

	polMu    sync.RWMutex
	policies map[string]*compiledPolicy

	dec  decider    // the agent's use-time decision (decide.go)
	memo *writeMemo // entries known to be in the kernel already
	fast *fastCache // prepared UDP replies (fast.go); nil without cache or memo

	warnUp, warnWrite logLimiter // one warning a second each

	// server state (server.go)
	mu       sync.Mutex
	started  bool
	closed   bool
	udp      *udpGroup
	parked   int // UDP workers started (ParkedWorkers)
	tcp      *net.TCPListener
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup // TCP and upstream-bound UDP queries
	udpWG    sync.WaitGroup // UDP workers
	sem      chan struct{}  // MaxInflight
	tcpConns chan struct{}  // MaxTCPConns
	upPer    *perSession    // upstream-bound UDP queries per session
	tcpPer   *perSession    // TCP connections per session
}

// New checks cfg and builds a Resolver. It reads ResolvConf when no
// Upstreams are given; it binds nothing until Start.
func New(cfg Config) (*Resolver, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(cfg.Upstreams) == 0 {
		ups, err := upstreamsFromResolvConf(cfg.ResolvConf)
		if err != nil {
			return nil, err
		}
		cfg.Upstreams = ups
	}
	cfg.Upstreams = slices.Clone(cfg.Upstreams)
	cfg.PassthroughTypes = slices.Clone(cfg.PassthroughTypes)
	r := &Resolver{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "dnsresolver"),
		fwd:      newForwarder(cfg.Upstreams, cfg.UpstreamTimeout),
		cache:    newCache(cfg.CacheSize),
		policies: map[string]*compiledPolicy{},
		sem:      make(chan struct{}, cfg.MaxInflight),
		tcpConns: make(chan struct{}, cfg.MaxTCPConns),
		upPer:    newPerSession(cfg.PerSessionLimit),
		tcpPer:   newPerSession(cfg.PerSessionLimit),
	}
	r.limits = newLimits(&r.cfg)
	r.host = cfg.HostAddrs
	if r.host == nil {
		r.host, r.watch = NewHostAddrs(), true
	}
	if !cfg.AlwaysWrite {
		r.memo = newWriteMemo(memoSize)
		if r.cache != nil {
			r.fast = newFastCache(cfg.CacheSize)
		}
	}
	r.up = r.fwd
	if cfg.up != nil {
		r.up = cfg.up
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// Upstreams returns the nameservers the resolver forwards to.
func (r *Resolver) Upstreams() []netip.AddrPort { return slices.Clone(r.cfg.Upstreams) }

// SetPolicy replaces the DNS policy of a session (by session name, as the
// Dataplane names it). The whole policy is checked first; on error the old
// one stays. A session without a policy may resolve nothing.
//
// It costs the session's own state and nothing else: the agent calls it at
// every grant, revoke or expiry of the session, whatever the grant's class.
// The session's prepared replies (fast.go) and remembered decisions
// (decide.go), which each name the compiled policy they were made under and
// are never used under another, are dropped (each cache knows a session's
// entries: no walk of every session's). The write memo is kept: what it
// knows is which entries are in the kernel, per grant handle, which no
// policy change makes false (a revoked grant's handle is never reused: a
// recycled slot comes with a new generation); forgetting it would also bump
// its generation, which voids every session's prepared replies.
func (r *Resolver) SetPolicy(session string, p Policy) error {
	if session == "" {
		return fmt.Errorf("%w: empty session name", ErrInvalidGrant)
	}
	c, err := compilePolicy(p)
	if err != nil {
		return fmt.Errorf("session %s: %w", session, err)
	}
	r.polMu.Lock()
	r.policies[session] = c
	r.polMu.Unlock()
	r.fast.forget(session)
	r.dec.forget(session)
	return nil
}

// RemovePolicy drops a session's policy and its counters; its queries are
// refused from now on. Entries already written expire on their own (and die
// with the session's cgroup or grant handles).
func (r *Resolver) RemovePolicy(session string) {
	r.polMu.Lock()
	delete(r.policies, session)
	r.polMu.Unlock()
	r.memo.forget(session)
	r.fast.forget(session)
	r.dec.forget(session)
	r.stats.forget(session)
}

func (r *Resolver) policy(session string) *compiledPolicy {
	r.polMu.RLock()
	defer r.polMu.RUnlock()
	return r.policies[session]
}

// Stats returns a snapshot of the counters.
func (r *Resolver) Stats() Stats { return r.stats.snapshot() }

// query is the state of one query being answered.
type query struct {
	transport string
	index     uint32
	session   string
	sc        *counters // nil when the session is unknown
	req       *dns.Msg
	rule      string // the rule of a decision that refused it
}

// newQuery counts a query and identifies its session from the address it
// arrived on, the only thing the session cannot forge.
func (r *Resolver) newQuery(local netip.Addr, transport string, req *dns.Msg) *query {
	q := &query{transport: transport, req: req}
	r.stats.total.queries.Add(1)
	if idx, ok := SessionIndexFromAddr(local); ok {
		q.index = idx
		if name, ok := r.cfg.SessionName(idx); ok {
			q.session = name
			q.sc = r.stats.session(name)
			q.sc.queries.Add(1)
		}
	}
	return q
}

// handle answers one query that arrived on local. It returns nil when no
// reply must be sent (the message was itself a response).
func (r *Resolver) handle(ctx context.Context, local netip.Addr, transport string, req *dns.Msg) *dns.Msg {
	m, p := r.begin(local, transport, req)
	if p == nil {
		return m
	}
	return r.finish(ctx, p)
}

// pending is a query that passed every check and needs an answer: from the
// cache (res set) or from the upstream (res nil).
type pending struct {
	q      *query
	qname  string
	qtype  uint16
	pol    *compiledPolicy
	grants []*compiledGrant
	dgen   uint64 // the decision generation before the decision was asked
	now    time.Time
	res    *result
}

// begin does everything that never blocks: identify the session, check the
// message, the name, the policy and the type, and look in the cache. It
// returns either a reply (nil to send none) or a pending query. Nothing is
// ever sent upstream for a query that does not reach the pending state.
func (r *Resolver) begin(local netip.Addr, transport string, req *dns.Msg) (*dns.Msg, *pending) {
	q := r.newQuery(local, transport, req)
	if req.Response {
		return nil, nil
	}
	if q.session == "" {
		m := r.refuse(q, ReasonUnknownSession, dns.RcodeRefused)
		if transport == "udp" && !local.IsLoopback() {
			// Sent to one of the host's real addresses (the socket is bound
			// to 0.0.0.0): no reply, so the resolver never reflects spoofed
			// datagrams at anyone.
			return nil, nil
		}
		return m, nil
	}
	if req.Opcode != dns.OpcodeQuery {
		return r.refuse(q, ReasonMalformed, dns.RcodeNotImplemented), nil
	}
	if len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		return r.refuse(q, ReasonMalformed, dns.RcodeFormatError), nil
	}
	qname, err := CanonicalName(req.Question[0].Name)
	if err != nil {
		return r.refuse(q, ReasonInvalidName, r.cfg.DenyRcode), nil
	}
	pol := r.policy(q.session)
	if pol == nil {
		return r.refuse(q, ReasonNotAllowed, r.cfg.DenyRcode), nil
	}
	if pol.denied(qname) {
		return r.refuse(q, ReasonDenied, r.cfg.DenyRcode), nil
	}
	grants := pol.grants(qname)
	if len(grants) == 0 {
		return r.refuse(q, ReasonNotAllowed, r.cfg.DenyRcode), nil
	}
	// The agent's use-time decision (admin and hard-deny forbids, the live
	// grants), asked under the generation read first: a reply prepared
	// under it is void once the agent's policies change.
	dgen := r.dec.gen.Load()
	if grants, q.rule = r.decideGrants(q.session, qname, pol, dgen, grants); len(grants) == 0 {
		return r.refuse(q, ReasonDecision, r.cfg.DenyRcode), nil
	}
	// Only now, with an allowed name, may anything go upstream.
	qtype := req.Question[0].Qtype
	switch {
	case qtype == dns.TypeA || qtype == dns.TypeAAAA || slices.Contains(r.cfg.PassthroughTypes, qtype):
	case qtype == dns.TypeHTTPS || qtype == dns.TypeSVCB || qtype == dns.TypeCNAME:
		// Answered empty, locally: HTTPS/SVCB address hints would bypass the
		// entries, and clients fall back to A/AAAA on NODATA.
		both(&r.stats.total, q.sc, func(c *counters) { c.answered.Add(1) })
		return r.reply(q, dns.RcodeSuccess), nil
	default:
		return r.refuse(q, ReasonQType, dns.RcodeRefused), nil
	}
	p := &pending{q: q, qname: qname, qtype: qtype, pol: pol, grants: grants, dgen: dgen, now: r.cfg.now()}
	p.res = r.cache.get(cacheKey{qname, qtype}, p.now)
	if p.res != nil {
		both(&r.stats.total, q.sc, func(c *counters) { c.cacheHits.Add(1) })
	}
	return nil, p
}

// finish asks the upstream if the cache had nothing (this blocks), writes
// the entries and builds the answer.
func (r *Resolver) finish(ctx context.Context, p *pending) *dns.Msg {
	if m := r.resolve(ctx, p); m != nil {
		return m
	}
	return r.complete(p, r.plan(p))
}

// resolve asks the upstream if the cache had nothing (this blocks) and
// checks the CNAME chain: a non-nil reply ends the query there.
func (r *Resolver) resolve(ctx context.Context, p *pending) *dns.Msg {
	q := p.q
	if p.res == nil {
		// Queries for the same name and type that miss together share one
		// upstream query (whichever session asked first: the result holds
		// no session data; the cache counts it as that session's).
		k := cacheKey{p.qname, p.qtype}
		var err error
		p.res, err = r.flight.do(k, func() (*result, error) {
			resp, err := r.up.exchange(ctx, upstreamQuery(p.qname, p.qtype))
			if err != nil {
				return nil, err
			}
			res, err := r.parse(p.qname, p.qtype, resp, p.now)
			if err == nil {
				r.cache.put(k, res, q.session, p.now)
			}
			return res, err
		})
		if err != nil {
			if errors.Is(err, errBadTarget) {
				return r.refuse(q, ReasonCNAMEDenied, r.cfg.DenyRcode)
			}
			if ok, n := r.warnUp.allow(time.Now()); ok {
				r.log.Warn("upstream failed; SERVFAIL", "session", q.session, "name", p.qname, "qtype", dns.TypeToString[p.qtype], "err", err, "suppressed", n)
			}
			return r.servfail(q)
		}
	}
	for _, l := range p.res.chain {
		if p.pol.denied(l.target) {
			return r.refuse(q, ReasonCNAMEDenied, r.cfg.DenyRcode)
		}
	}
	for _, l := range p.res.chain {
		// A target is reached under the question's grants: the decision
		// must allow it too.
		if p.grants, q.rule = r.decideGrants(q.session, l.target, p.pol, p.dgen, p.grants); len(p.grants) == 0 {
			return r.refuse(q, ReasonDecision, r.cfg.DenyRcode)
		}
	}
	return nil
}

var (
	errBadTarget    = errors.New("CNAME target is not a valid host name")
	errChainTooLong = errors.New("CNAME chain too long")
	errChainLoop    = errors.New("CNAME loop")
)

// parse reduces an upstream reply to a result. Only records on the CNAME
// chain from qname are kept; TTLs are clamped and turned into expiry times.
func (r *Resolver) parse(qname string, qtype uint16, m *dns.Msg, now time.Time) (*result, error) {
	res := &result{rcode: m.Rcode, final: qname, expires: now.Add(r.cfg.MaxTTL)}
	exp := func(ttl uint32) time.Time {
		t := r.clampTTL(ttl)
		e := now.Add(t)
		if e.Before(res.expires) {
			res.expires = e
		}
		return e
	}
	cnames := map[string]*dns.CNAME{}
	for _, rr := range m.Answer {
		if c, ok := rr.(*dns.CNAME); ok && c.Hdr.Class == dns.ClassINET {
			if owner, err := CanonicalName(c.Hdr.Name); err == nil {
				if _, dup := cnames[owner]; !dup {
					cnames[owner] = c
				}
			}
		}
	}
	seen := map[string]bool{qname: true}
	for cur := qname; ; {
		c, ok := cnames[cur]
		if !ok {
			break
		}
		if len(res.chain) == r.cfg.MaxCNAMEChain {
			return nil, fmt.Errorf("%w: %s: %w (max %d)", ErrUpstream, qname, errChainTooLong, r.cfg.MaxCNAMEChain)
		}
		target, err := CanonicalName(c.Target)
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %w", qname, errBadTarget, err)
		}
		if seen[target] {
			return nil, fmt.Errorf("%w: %s: %w at %s", ErrUpstream, qname, errChainLoop, target)
		}
		seen[target] = true
		res.chain = append(res.chain, link{owner: cur, target: target, expires: exp(c.Hdr.Ttl)})
		cur = target
		res.final = target
	}
	for _, rr := range m.Answer {
		h := rr.Header()
		if h.Class != dns.ClassINET || h.Rrtype != qtype {
			continue
		}
		if owner, err := CanonicalName(h.Name); err != nil || owner != res.final {
			continue
		}
		// Bounded before anything is built from them (MaxAnswerRecords):
		// the records past the bound are never kept, written or sent.
		switch v := rr.(type) {
		case *dns.A:
			if a, ok := netip.AddrFromSlice(v.A.To4()); ok && v.A.To4() != nil && len(res.addrs) < 4*r.cfg.MaxAnswerRecords {
				res.addrs = append(res.addrs, addrRec{addr: a, expires: exp(h.Ttl)})
			}
		case *dns.AAAA:
			if a, ok := netip.AddrFromSlice(v.AAAA.To16()); ok && len(v.AAAA) == net.IPv6len && len(res.addrs) < 4*r.cfg.MaxAnswerRecords {
				res.addrs = append(res.addrs, addrRec{addr: a, expires: exp(h.Ttl)})
			}
		default:
			if len(res.other) == r.cfg.MaxAnswerRecords {
				continue
			}
			c := dns.Copy(rr)
			res.other = append(res.other, c)
			res.otherEx = append(res.otherEx, exp(h.Ttl))
		}
	}
	if res.rcode == dns.RcodeNameError {
		res.addrs, res.other, res.otherEx = nil, nil, nil // a name that does not exist has no addresses
	}
	if len(res.addrs) == 0 && len(res.other) == 0 {
		// Negative answer (NXDOMAIN or NODATA): cache it briefly, for the
		// SOA's negative TTL clamped like any other TTL.
		neg := uint32(0)
		for _, rr := range m.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				neg = min(soa.Hdr.Ttl, soa.Minttl)
			}
		}
		exp(neg)
	}
	return res, nil
}

func (r *Resolver) clampTTL(ttl uint32) time.Duration {
	return min(max(time.Duration(ttl)*time.Second, r.cfg.MinTTL), r.cfg.MaxTTL)
}

// ttlAt is the TTL left at now until expires, in whole seconds rounded
// down: a client caching the answer never outlives the kernel entry.
func ttlAt(expires, now time.Time) uint32 {
	d := expires.Sub(now)
	if d <= 0 {
		return 0
	}
	return uint32(d / time.Second)
}

// reply starts a reply to q with the given rcode.
func (r *Resolver) reply(q *query, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.Id = q.req.Id
	m.Response = true
	m.Opcode = q.req.Opcode
	m.RecursionDesired = q.req.RecursionDesired
	m.RecursionAvailable = true
	m.CheckingDisabled = q.req.CheckingDisabled
	m.Rcode = rcode
	if len(q.req.Question) == 1 {
		m.Question = []dns.Question{q.req.Question[0]}
	}
	if opt := q.req.IsEdns0(); opt != nil {
		m.SetEdns0(1232, false)
	}
	return m
}

func (r *Resolver) servfail(q *query) *dns.Msg {
	both(&r.stats.total, q.sc, func(c *counters) { c.servfail.Add(1) })
	return r.reply(q, dns.RcodeServerFailure)
}

// refuse counts, reports and answers a refused query.
func (r *Resolver) refuse(q *query, why Reason, rcode int) *dns.Msg {
	both(&r.stats.total, q.sc, func(c *counters) {
		c.refused.Add(1)
		c.denials[why].Add(1)
	})
	debug := r.log.Enabled(context.Background(), slog.LevelDebug)
	if r.cfg.OnDenial != nil || debug {
		d := Denial{Time: r.cfg.now(), Session: q.session, Index: q.index, Transport: q.transport, Reason: why, Rule: q.rule}
		if len(q.req.Question) > 0 {
			d.Name = safeName(q.req.Question[0].Name)
			d.QType = q.req.Question[0].Qtype
		}
		if debug {
			r.log.Debug("dns query refused", "session", d.Session, "index", d.Index, "name", d.Name,
				"qtype", dns.TypeToString[d.QType], "reason", why.String(), "rule", d.Rule, "transport", d.Transport)
		}
		if r.cfg.OnDenial != nil {
			r.cfg.OnDenial(d)
		}
	}
	return r.reply(q, rcode)
}
