package dnsresolver

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"
)

// Per-session token buckets: one for queries (Config.QueryRate and
// QueryBurst), taken by the transport before anything else is done with a
// query, and one for kernel writes (Config.WriteRate and WriteBurst), taken
// by an answer for the entries it must write before it may be sent.
//
// A bucket is GCRA (the generic cell rate algorithm): one atomic word, the
// theoretical arrival time, so taking a token costs one load and one
// compare-and-swap and never a lock. Buckets are kept per session index
// (the one thing the session cannot forge) and dropped once full again
// (a full bucket holds no state), so their number follows the sessions
// that asked lately.

// limiter is the shape of one kind of bucket: interval ns per token, tau ns
// of burst (burst × interval). interval 0: unlimited.
type limiter struct {
	interval, tau int64
}

func newLimiter(rate, burst int) limiter {
	if rate <= 0 {
		return limiter{}
	}
	iv := int64(time.Second) / int64(rate)
	return limiter{interval: max(iv, 1), tau: max(iv, 1) * int64(burst)}
}

// bucket is one GCRA bucket: tat is the theoretical arrival time (Unix ns).
type bucket struct{ tat atomic.Int64 }

// take takes n tokens at now (Unix ns). More than the burst at once is
// allowed from a full bucket (it then owes the difference), so an answer
// with more entries than WriteBurst still goes through, once.
func (l limiter) take(b *bucket, now, n int64) bool {
	if l.interval == 0 {
		return true
	}
	for {
		tat := b.tat.Load()
		next := max(tat, now) + n*l.interval
		if next-now > l.tau && tat > now {
			return false
		}
		if b.tat.CompareAndSwap(tat, next) {
			return true
		}
	}
}

// full reports whether b is full at now (it holds no state).
func (b *bucket) full(now int64) bool { return b.tat.Load() <= now }

// sessionLimit is one session index's buckets.
type sessionLimit struct {
	queries, writes bucket
	reported        atomic.Int64  // Unix ns of the last rate Denial reported
	excess          atomic.Int64  // Unix ns of the last query over the rate
	window          atomic.Int64  // Unix ns the current one-second window began
	inWindow        atomic.Uint64 // queries over the rate in that window
}

// limits holds every session index's buckets.
type limits struct {
	queries, writes limiter
	m               sync.Map // uint32 -> *sessionLimit
}

func newLimits(c *Config) *limits {
	return &limits{queries: newLimiter(c.QueryRate, c.QueryBurst), writes: newLimiter(c.WriteRate, c.WriteBurst)}
}

func (l *limits) session(idx uint32) *sessionLimit {
	if v, ok := l.m.Load(idx); ok {
		return v.(*sessionLimit)
	}
	v, _ := l.m.LoadOrStore(idx, new(sessionLimit))
	return v.(*sessionLimit)
}

// query takes one query token for the session at idx.
func (l *limits) query(idx uint32, now int64) bool {
	if l.queries.interval == 0 {
		return true
	}
	return l.queries.take(&l.session(idx).queries, now, 1)
}

// write takes n write tokens for the session at idx.
func (l *limits) write(idx uint32, now int64, n int) bool {
	if l.writes.interval == 0 || n == 0 {
		return true
	}
	return l.writes.take(&l.session(idx).writes, now, int64(n))
}

// sweep drops the buckets that are full again and hold no recent excess.
func (l *limits) sweep(now int64, hold time.Duration) {
	l.m.Range(func(k, v any) bool {
		s := v.(*sessionLimit)
		if s.queries.full(now) && s.writes.full(now) && now-s.excess.Load() > int64(hold) {
			l.m.Delete(k)
		}
		return true
	})
}

// report reports whether a rate Denial may be reported for s at now: at
// most one a second per session.
func (s *sessionLimit) report(now int64) bool {
	last := s.reported.Load()
	return now-last >= int64(time.Second) && s.reported.CompareAndSwap(last, now)
}

// refusedRaw appends to out a REFUSED reply to the wire query raw, built
// from its bytes without unpacking it: the header with QR and RA set, AA,
// TC, AD and the counts of answer, authority and additional records clear,
// and the question when there is exactly one. ok is false for what is no
// query (too short, or a response), which gets no reply.
func refusedRaw(raw, out []byte) (_ []byte, ok bool) {
	if len(raw) < 12 || raw[2]&0x80 != 0 {
		return out, false
	}
	end := 12
	qd := binary.BigEndian.Uint16(raw[4:])
	if qd == 1 {
		// The question name: labels up to the root, or a pointer.
		off := 12
		for off < len(raw) {
			l := int(raw[off])
			if l == 0 {
				off++
				break
			}
			if l&0xc0 != 0 {
				off = len(raw) + 1 // no pointer in a question: drop it
				break
			}
			off += 1 + l
		}
		if off+4 <= len(raw) {
			end = off + 4
		} else {
			qd = 0
		}
	} else {
		qd = 0
	}
	start := len(out)
	out = append(out, raw[:end]...)
	w := out[start:]
	w[2] = 0x80 | raw[2]&0x79 // QR, opcode and RD kept; AA and TC clear
	w[3] = 0x80 | raw[3]&0x10 | 5
	binary.BigEndian.PutUint16(w[4:], qd)
	clear(w[6:12])
	return out, true
}

// admit takes a query token for the session at index idx (0: the address
// is no session's, never limited) for the wire query raw. limited false: go
// on with the query. Otherwise the query is over the session's rate and is
// counted; reply is then the REFUSED reply to send (appended to out), or nil
// when none is sent (a session in the penalty box, or no query at all).
func (r *Resolver) admit(idx uint32, transport string, raw []byte, now time.Time, out []byte) (reply []byte, limited bool) {
	if idx == 0 || r.limits.queries.interval == 0 {
		return nil, false
	}
	s := r.limits.session(idx)
	ns := now.UnixNano()
	if r.limits.queries.take(&s.queries, ns, 1) {
		return nil, false
	}
	r.overRate(s, idx, ns)
	r.stats.total.queries.Add(1)
	var sc *counters
	name, known := r.cfg.SessionName(idx)
	if known {
		sc = r.stats.session(name)
		sc.queries.Add(1)
	}
	reply, ok := refusedRaw(raw, out)
	if !ok || r.penalised(idx) {
		both(&r.stats.total, sc, func(c *counters) { c.rateDropped.Add(1) })
		return nil, true
	}
	both(&r.stats.total, sc, func(c *counters) {
		c.refused.Add(1)
		c.denials[ReasonRate].Add(1)
	})
	if r.cfg.OnDenial != nil && known && s.report(ns) {
		r.cfg.OnDenial(Denial{Time: now, Session: name, Index: idx, Transport: transport, Reason: ReasonRate})
	}
	return reply, true
}
