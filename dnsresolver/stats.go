package dnsresolver

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Reason says why a query was refused.
type Reason uint8

const (
	ReasonUnknownSession Reason = iota // arrived on an address that is no live session's
	ReasonMalformed                    // not a single IN-class standard query
	ReasonInvalidName                  // failed CanonicalName
	ReasonNotAllowed                   // no grant matches the name
	ReasonDenied                       // a deny pattern matches the name
	ReasonQType                        // query type not served (ANY, AXFR, ...)
	ReasonCNAMEDenied                  // a CNAME target matches a deny pattern or is not a valid name
	ReasonDecision                     // the agent's use-time decision (SetDecide) denied the name or a CNAME target
	ReasonRate                         // over the session's query rate (Config.QueryRate)
	ReasonEntryCap                     // the session holds its cap of DNS-derived kernel entries (backend.ErrEntryCap)
	NumReasons
)

var reasonNames = [NumReasons]string{"unknown_session", "malformed", "invalid_name", "not_allowed", "denied", "qtype", "cname_denied", "decision", "rate", "entry_cap"}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// Denial is one refused query. Name is the query name as received, made safe
// to log (strconv.Quote-style escaping, at most 300 bytes): it is the
// session's data, possibly the very exfiltration attempt, so do not use it as
// a metric label. Queries refused for rate (ReasonRate) are reported at most
// once a second per session, without Name or QType (the query is not
// unpacked): the counters have them all.
type Denial struct {
	Time      time.Time
	Session   string // "" when unknown
	Index     uint32 // session kernel index, 0 when the address was no session's
	Name      string
	QType     uint16
	Transport string // "udp" or "tcp"
	Reason    Reason
	Rule      string // ReasonDecision: the rule that decided (the agent's Cedar policy id)
}

// Counters are monotonic counts, for one session or for the whole resolver.
type Counters struct {
	Queries        uint64 // every query received
	Answered       uint64 // NOERROR or NXDOMAIN answers from upstream or cache
	Refused        uint64 // refused (any Reason)
	ServFail       uint64 // SERVFAIL: upstream failure, chain too long or an entry write failed
	CacheHits      uint64
	EntriesWritten uint64             // AllowEgress calls that succeeded
	WriteErrors    uint64             // AllowEgress calls that failed
	WritesSkipped  uint64             // identical entries already written (see Config.AlwaysWrite)
	Stripped       uint64             // addresses dropped: non-public, or the host's own
	HostStripped   uint64             // of Stripped: the host's own addresses (Config.HostAddrs)
	Dropped        uint64             // UDP queries dropped: MaxInflight or PerSessionLimit queries already pending
	RateDropped    uint64             // queries over the session's rate dropped without a reply (in the penalty box)
	KernelDropped  uint64             // UDP queries of a session in the penalty box, over its rate, dropped by the kernel before the resolver read them (not in Queries)
	WriteLimited   uint64             // answers withheld (SERVFAIL) for want of write tokens (Config.WriteRate)
	Denials        [NumReasons]uint64 // Denials[ReasonRate]: queries over the session's rate answered REFUSED
}

type counters struct {
	queries, answered, refused, servfail, cacheHits, written, writeErr, memoHits, stripped, dropped atomic.Uint64
	rateDropped, writeLimited, hostStripped, kernelDropped                                          atomic.Uint64
	denials                                                                                         [NumReasons]atomic.Uint64
}

func (c *counters) snapshot() Counters {
	s := Counters{
		Queries: c.queries.Load(), Answered: c.answered.Load(), Refused: c.refused.Load(),
		ServFail: c.servfail.Load(), CacheHits: c.cacheHits.Load(), EntriesWritten: c.written.Load(),
		WriteErrors: c.writeErr.Load(), WritesSkipped: c.memoHits.Load(), Stripped: c.stripped.Load(), Dropped: c.dropped.Load(),
		RateDropped: c.rateDropped.Load(), WriteLimited: c.writeLimited.Load(), HostStripped: c.hostStripped.Load(),
		KernelDropped: c.kernelDropped.Load(),
	}
	for i := range c.denials {
		s.Denials[i] = c.denials[i].Load()
	}
	return s
}

// Stats is a snapshot of the resolver's counters. Sessions is keyed by
// session name; queries from unknown addresses count in Total only. A
// Prometheus collector can export Total and Sessions as counters with labels
// session and reason.
type Stats struct {
	Total    Counters
	Sessions map[string]Counters
}

type stats struct {
	total    counters
	sessions sync.Map // string -> *counters
}

// session returns the counters of a session ("" means none: a dummy).
func (s *stats) session(name string) *counters {
	if name == "" {
		return nil
	}
	if c, ok := s.sessions.Load(name); ok {
		return c.(*counters)
	}
	c, _ := s.sessions.LoadOrStore(name, new(counters))
	return c.(*counters)
}

func (s *stats) snapshot() Stats {
	out := Stats{Total: s.total.snapshot(), Sessions: map[string]Counters{}}
	s.sessions.Range(func(k, v any) bool {
		out.Sessions[k.(string)] = v.(*counters).snapshot()
		return true
	})
	return out
}

// forget drops a session's counters (after RemovePolicy).
func (s *stats) forget(name string) { s.sessions.Delete(name) }

// both applies f to the total and, when known, the session counters.
func both(t *counters, sc *counters, f func(*counters)) {
	f(t)
	if sc != nil {
		f(sc)
	}
}

// safeName makes a session-supplied name safe for logs and events.
func safeName(s string) string {
	const max = 300
	q := strconv.Quote(s)
	q = q[1 : len(q)-1]
	if len(q) > max {
		q = q[:max] + "..."
	}
	return q
}

// logLimiter lets one warning through per interval and counts the rest, so
// a dead upstream or a flood cannot fill the log.
type logLimiter struct {
	next       atomic.Int64 // Unix ns before which warnings are suppressed
	suppressed atomic.Uint64
}

// allow reports whether to log now, and how many were suppressed before.
func (l *logLimiter) allow(now time.Time) (bool, uint64) {
	n := l.next.Load()
	if now.UnixNano() < n || !l.next.CompareAndSwap(n, now.Add(time.Second).UnixNano()) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}
