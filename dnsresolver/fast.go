package dnsresolver

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// The fast path answers a UDP query from a wire-format reply prepared by the
// full path, when everything that reply depends on is still what it was: the
// session at the address the kernel reported, the session's policy (the same
// compiled policy, which is immutable: SetPolicy and RemovePolicy replace it),
// the agent's use-time decision (the same generation: SetDecide and
// DecisionsChanged bump it; the decision is asked by the full path only),
// the cached upstream result (the same one, not expired), the write memo's
// part for the session (the same generation: nothing of the session's
// forgotten since, so every entry the answer relies on is still written
// with an expiry covering its TTL; another session's part dropped changes
// nothing here) and the host's address set (the
// same generation: an address that became the host's is stripped again). It
// never decides anything the full path would not: a query it does not take,
// or whose prepared reply is missing or stale, goes through the full path
// (handleRaw), which prepares a new one. Query tokens (limit.go) are taken
// before either path, by the transport.
//
// It takes only the plainest queries: one question of class IN in
// uncompressed labels of letters, digits and '-' that pass the same rules as
// CanonicalName (checked on the wire, before any lookup), no other records
// than one OPT without options, nothing after. The reply is the prepared one
// with the query's ID, RD and CD bits, the question name as the client wrote
// it (0x20), the TTLs left at now, and an OPT when the query had one: byte for
// byte what the full path would send (FuzzFastPath checks this).

// fastMaxReply keeps prepared replies (with an OPT) within 512 bytes, so no
// client size ever truncates them.
const fastMaxReply = 512

// optRR is the OPT record of every reply to an EDNS query (SetEdns0(1232, false)).
var optRR = [11]byte{0, 0, 41, 1232 >> 8, 1232 & 0xff, 0, 0, 0, 0, 0, 0}

// fastEntry is one prepared reply, for one session index, name and type.
type fastEntry struct {
	session string
	qname   string // canonical: the answer cache key
	pol     *compiledPolicy
	res     *result
	memoGen uint64
	decGen  uint64 // the decision generation it was prepared under
	hostGen uint64 // the host address set's generation it was prepared under
	rules   uint64 // memo hits the full path would count
	wire    []byte // ID 0, RD and CD clear, no OPT, question name lower case
	names   []uint16
	ttls    []uint16
	exps    []time.Time // the expiry behind each TTL
}

// fastCache maps fastKey bytes to prepared replies. It knows each session's
// keys, so forgetting a session (at every change of its policy) costs that
// session's replies, not a walk of every session's, and a full cache drops
// the replies of the sessions holding the most (share.go), which only costs
// them full-path answers.
type fastCache struct {
	mu        sync.RWMutex
	max       int
	m         map[string]*fastEntry
	bySession map[string]map[string]struct{} // session name -> its keys in m
}

func newFastCache(max int) *fastCache {
	return &fastCache{max: max, m: make(map[string]*fastEntry), bySession: make(map[string]map[string]struct{})}
}

func (c *fastCache) get(k []byte) *fastEntry {
	c.mu.RLock()
	e := c.m[string(k)]
	c.mu.RUnlock()
	return e
}

func (c *fastCache) put(k string, e *fastEntry) {
	c.mu.Lock()
	old, had := c.m[k]
	if !had && len(c.m) >= c.max {
		for _, s := range largestFirst(c.bySession, func(keys map[string]struct{}) int { return len(keys) }, len(c.m), roomFor(c.max)) {
			c.forgetLocked(s)
		}
	}
	if had && old.session != e.session {
		// A new session at the same index: the key is its now.
		delete(c.bySession[old.session], k)
	}
	c.m[k] = e
	keys := c.bySession[e.session]
	if keys == nil {
		keys = make(map[string]struct{})
		c.bySession[e.session] = keys
	}
	keys[k] = struct{}{}
	c.mu.Unlock()
}

// forget drops a session's prepared replies (they would fail the policy
// check anyway; this frees them and the policy they hold).
func (c *fastCache) forget(session string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.forgetLocked(session)
	c.mu.Unlock()
}

// forgetLocked is forget with c.mu held.
func (c *fastCache) forgetLocked(session string) {
	for k := range c.bySession[session] {
		if e, ok := c.m[k]; ok && e.session == session {
			delete(c.m, k)
		}
	}
	delete(c.bySession, session)
}

// fastKey appends the key of a prepared reply: session index, query type and
// the lower-case wire form of the canonical name.
func fastKey(b []byte, index uint32, qtype uint16, lowerWire []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, index)
	b = binary.BigEndian.AppendUint16(b, qtype)
	return append(b, lowerWire...)
}

// wireName is the wire form of a canonical name.
func wireName(b []byte, canonical string) []byte {
	for l := range strings.SplitSeq(canonical, ".") {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0)
}

// fastQuery is what the fast path reads from a query.
type fastQuery struct {
	name  []byte // the question name, wire form, as sent
	qtype uint16
	edns  bool
}

// parseFastQuery reads a query the fast path may take, appending the
// lower-case wire name to lower. ok is false for anything else, including
// every name CanonicalName would refuse.
func parseFastQuery(raw []byte, lower []byte) (q fastQuery, _ []byte, ok bool) {
	if len(raw) < 12+1+4 {
		return q, lower, false
	}
	// QR clear, opcode QUERY; one question, no answer or authority records,
	// at most one additional (the OPT).
	if raw[2]&0xf8 != 0 || raw[4] != 0 || raw[5] != 1 || raw[6]|raw[7]|raw[8]|raw[9]|raw[10] != 0 || raw[11] > 1 {
		return q, lower, false
	}
	off := 12
	for {
		if off >= len(raw) {
			return q, lower, false
		}
		l := int(raw[off])
		if l == 0 {
			break
		}
		// No compression pointer or extended label, the label within the
		// message, the name within 253 characters (255 octets of wire).
		if l > MaxLabelLen || off+1+l > len(raw) || off+1+l-12 > MaxNameLen+1 {
			return q, lower, false
		}
		label := raw[off+1 : off+1+l]
		if label[0] == '-' || label[l-1] == '-' {
			return q, lower, false
		}
		lower = append(lower, byte(l))
		digits := true
		for _, c := range label {
			switch {
			case c >= 'a' && c <= 'z', c == '-':
				digits = false
			case c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
				digits = false
			case c >= '0' && c <= '9':
			default:
				return q, lower, false
			}
			lower = append(lower, c)
		}
		off += 1 + l
		if off < len(raw) && raw[off] == 0 && digits {
			return q, lower, false // numeric top-level label
		}
	}
	if off == 12 {
		return q, lower, false // the root
	}
	lower = append(lower, 0)
	q.name = raw[12 : off+1]
	off++
	if off+4 > len(raw) || raw[off+2] != 0 || raw[off+3] != 1 { // class IN
		return q, lower, false
	}
	q.qtype = binary.BigEndian.Uint16(raw[off:])
	off += 4
	if raw[11] == 1 {
		// Root owner, type OPT, any size, flags and version, no options.
		if off+11 != len(raw) || raw[off] != 0 || raw[off+1] != 0 || raw[off+2] != 41 || raw[off+9] != 0 || raw[off+10] != 0 {
			return q, lower, false
		}
		q.edns = true
		off += 11
	}
	return q, lower, off == len(raw)
}

// fastScratch is one UDP worker's scratch space.
type fastScratch struct {
	key []byte
}

// answerFast appends to out the reply to raw, a UDP query that arrived on
// local, if the fast path can give it; ok false means use the full path.
func (r *Resolver) answerFast(s *fastScratch, local [4]byte, raw []byte, now time.Time, out []byte) (_ []byte, ok bool) {
	if r.fast == nil {
		return out, false
	}
	idx, isSession := SessionIndexFromAddr(netip.AddrFrom4(local))
	if !isSession {
		return out, false
	}
	key := fastKey(s.key[:0], idx, 0, nil)
	q, key, ok := parseFastQuery(raw, key)
	s.key = key
	if !ok {
		return out, false
	}
	binary.BigEndian.PutUint16(key[4:], q.qtype)
	e := r.fast.get(key)
	if e == nil {
		return out, false
	}
	session, ok := r.cfg.SessionName(idx)
	if !ok || session != e.session || r.policy(session) != e.pol || r.memo.current(session) != e.memoGen || r.dec.gen.Load() != e.decGen || r.host.generation() != e.hostGen ||
		r.cache.get(cacheKey{e.qname, q.qtype}, now) != e.res {
		return out, false
	}
	start := len(out)
	out = append(out, e.wire...)
	w := out[start:]
	w[0], w[1] = raw[0], raw[1]
	w[2] |= raw[2] & 0x01 // RD
	w[3] |= raw[3] & 0x10 // CD
	for _, o := range e.names {
		copy(w[o:], q.name)
	}
	for i, o := range e.ttls {
		binary.BigEndian.PutUint32(w[o:], ttlAt(e.exps[i], now))
	}
	if q.edns {
		w[11] = 1
		out = append(out, optRR[:]...)
	}
	r.stats.total.queries.Add(1)
	sc := r.stats.session(session)
	sc.queries.Add(1)
	both(&r.stats.total, sc, func(c *counters) {
		c.cacheHits.Add(1)
		if e.rules > 0 {
			c.memoHits.Add(e.rules)
		}
		c.answered.Add(1)
	})
	return out, true
}

// prepareFast stores the reply the full path just built for p (answered
// from p.res under p.pol, with pl.rules entries all written or known
// written as of memo generation pl.gen, and the host's addresses of
// generation pl.hostGen) as a prepared reply, unless an identical one is
// there.
func (r *Resolver) prepareFast(p *pending, pl *plan) {
	q, qname, qtype, pol, res, kept, now := p.q, p.qname, p.qtype, p.pol, p.res, pl.kept, p.now
	gen, dgen := pl.gen, p.dgen
	qwire := wireName(nil, qname)
	k := fastKey(nil, q.index, qtype, qwire)
	if e := r.fast.get(k); e != nil && e.session == q.session && e.pol == pol && e.res == res && e.memoGen == gen && e.decGen == dgen && e.hostGen == pl.hostGen {
		return
	}
	req := new(dns.Msg)
	req.Question = []dns.Question{{Name: qname + ".", Qtype: qtype, Qclass: dns.ClassINET}}
	m := r.answerMsg(&query{req: req}, qname, res, kept, now)
	wire, err := m.Pack()
	if err != nil || len(wire)+len(optRR) > fastMaxReply {
		return
	}
	e := &fastEntry{session: q.session, qname: qname, pol: pol, res: res, memoGen: gen, decGen: dgen, hostGen: pl.hostGen, rules: uint64(len(pl.rules)), wire: wire}
	for _, l := range res.chain {
		e.exps = append(e.exps, l.expires)
	}
	for _, a := range kept {
		e.exps = append(e.exps, a.expires)
	}
	e.exps = append(e.exps, res.otherEx...)
	var ok bool
	if e.names, e.ttls, ok = walkReply(wire, qwire); !ok || len(e.ttls) != len(e.exps) {
		return
	}
	r.fast.put(string(k), e)
}

// walkReply finds, in an uncompressed reply with one question and answers
// only, where the question name (qwire) sits and where each answer's TTL is.
func walkReply(w, qwire []byte) (names, ttls []uint16, ok bool) {
	if len(w) < 12 || binary.BigEndian.Uint16(w[4:]) != 1 || binary.BigEndian.Uint16(w[8:]) != 0 || binary.BigEndian.Uint16(w[10:]) != 0 {
		return nil, nil, false
	}
	if !bytes.HasPrefix(w[12:], qwire) {
		return nil, nil, false
	}
	names = append(names, 12)
	off := 12 + len(qwire) + 4
	for range binary.BigEndian.Uint16(w[6:]) {
		if bytes.HasPrefix(w[off:], qwire) {
			names = append(names, uint16(off))
		}
		for {
			if off >= len(w) || w[off] > MaxLabelLen {
				return nil, nil, false // end of message or compression
			}
			l := int(w[off])
			off += 1 + l
			if l == 0 {
				break
			}
		}
		if off+10 > len(w) {
			return nil, nil, false
		}
		ttls = append(ttls, uint16(off+4))
		off += 10 + int(binary.BigEndian.Uint16(w[off+8:]))
	}
	return names, ttls, off == len(w)
}
