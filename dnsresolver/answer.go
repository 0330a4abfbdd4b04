package dnsresolver

import (
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/agent/backend"
)

// plan is what an answer needs once the result and the grants are known:
// the addresses it carries and the entries it must write first.
type plan struct {
	kept     []addrRec            // at most MaxAnswerRecords
	rules    []backend.EgressRule // one per kept address and distinct grant
	todo     []backend.EgressRule // the rules the write memo does not hold
	stripped int
	gen      uint64 // the session's memo generation, read before any lookup: see prepareFast
	hostGen  uint64 // the host address set's generation, read before any lookup
}

// plan applies the session's grants to a result: it keeps the first
// MaxAnswerRecords addresses some grant allows (stripping non-public ones,
// see allows, and the host's own unless the grant names them, see
// namesHost), and lists the entries to write. It never blocks and writes
// nothing: the UDP worker calls it to learn whether the answer needs kernel
// writes, which it then leaves to another goroutine.
func (r *Resolver) plan(p *pending) *plan {
	q, qname, grants, res := p.q, p.qname, p.grants, p.res
	pl := &plan{gen: r.memo.gen(q.session), hostGen: r.host.generation(), kept: res.addrs[:0:0]}
	for _, ar := range res.addrs {
		if len(pl.kept) == r.cfg.MaxAnswerRecords {
			break // the bound: no more records built, written or sent
		}
		ok := false
		host := r.host.Contains(ar.addr)
		for _, g := range grants {
			if !g.allows(ar.addr) || host && !g.namesHost(ar.addr) {
				continue
			}
			ok = true
			rule := backend.EgressRule{Prefix: netip.PrefixFrom(ar.addr, ar.addr.BitLen()), Proto: g.Proto, Ports: g.Ports, Handle: g.Handle, Expires: ar.expires}
			if !slices.Contains(pl.rules, rule) { // two grants with the same handle, proto and ports
				pl.rules = append(pl.rules, rule)
			}
		}
		if ok {
			pl.kept = append(pl.kept, ar)
		} else {
			pl.stripped++
			both(&r.stats.total, q.sc, func(c *counters) {
				c.stripped.Add(1)
				if host {
					c.hostStripped.Add(1)
				}
			})
			r.log.Debug("stripped address", "session", q.session, "name", qname, "addr", ar.addr, "host", host)
		}
	}
	for _, rule := range pl.rules {
		if r.memo.has(q.session, rule) {
			both(&r.stats.total, q.sc, func(c *counters) { c.memoHits.Add(1) })
			continue
		}
		pl.todo = append(pl.todo, rule)
	}
	return pl
}

// complete writes the plan's entries (within the session's write tokens)
// and only then builds the answer. If a write fails, or the session is out
// of write tokens, the answer is withheld: SERVFAIL; when the session holds
// its cap of DNS-derived entries, DenyRcode with a Denial (ReasonEntryCap).
func (r *Resolver) complete(p *pending, pl *plan) *dns.Msg {
	q := p.q
	if !r.limits.write(q.index, r.cfg.now().UnixNano(), len(pl.todo)) {
		both(&r.stats.total, q.sc, func(c *counters) { c.writeLimited.Add(1) })
		return r.servfail(q)
	}
	for _, rule := range pl.todo {
		if err := r.cfg.Dataplane.AllowEgress(q.session, rule); err != nil {
			if errors.Is(err, backend.ErrEntryCap) {
				// Not silent: the session gets DenyRcode and the agent a
				// Denial saying why (the entries it holds expire, and the
				// collector frees the cap).
				return r.refuse(q, ReasonEntryCap, r.cfg.DenyRcode)
			}
			both(&r.stats.total, q.sc, func(c *counters) { c.writeErr.Add(1) })
			if ok, n := r.warnWrite.allow(time.Now()); ok {
				r.log.Warn("egress entry write failed; answer withheld", "session", q.session, "name", p.qname, "rule", rule.String(), "err", err, "suppressed", n)
			}
			return r.servfail(q)
		}
		r.memo.add(q.session, rule)
		both(&r.stats.total, q.sc, func(c *counters) { c.written.Add(1) })
	}
	m := r.answerMsg(q, p.qname, p.res, pl.kept, p.now)
	both(&r.stats.total, q.sc, func(c *counters) { c.answered.Add(1) })
	if r.fast != nil && q.transport == "udp" && pl.stripped == 0 {
		r.prepareFast(p, pl)
	}
	return m
}

// answerMsg builds the answer to q from res, with the kept addresses.
func (r *Resolver) answerMsg(q *query, qname string, res *result, kept []addrRec, now time.Time) *dns.Msg {
	m := r.reply(q, res.rcode)
	owner := func(name string) string {
		if name == qname {
			return q.req.Question[0].Name // keep the client's case (0x20)
		}
		return name + "."
	}
	for _, l := range res.chain {
		m.Answer = append(m.Answer, &dns.CNAME{
			Hdr:    dns.RR_Header{Name: owner(l.owner), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttlAt(l.expires, now)},
			Target: l.target + ".",
		})
	}
	for _, ar := range kept {
		h := dns.RR_Header{Name: owner(res.final), Class: dns.ClassINET, Ttl: ttlAt(ar.expires, now)}
		if ar.addr.Is4() {
			h.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: h, A: ar.addr.AsSlice()})
		} else {
			h.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: h, AAAA: ar.addr.AsSlice()})
		}
	}
	for i, rr := range res.other {
		c := dns.Copy(rr)
		c.Header().Name = owner(res.final)
		c.Header().Ttl = ttlAt(res.otherEx[i], now)
		m.Answer = append(m.Answer, c)
	}
	return m
}
