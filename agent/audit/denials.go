package audit

import (
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"
)

// Denials aggregates denials before they reach the log, so a flood of them
// costs the log a bounded number of records per session:
//
//   - per interval (the caller flushes, the daemon every second), one record
//     per (session, kind, class, reason, protocol, destination prefix or
//     object) with its Count: a /24 for IPv4, a /48 for IPv6 (the exact
//     address:port when only one was seen); a class without destinations
//     (process: the program refused) keys on its Object instead. The class
//     is the record's Action. A session's first MaxKeys keys of an interval get
//     their own record; its denials past them fold into one record per
//     (kind, reason) whose Resource says how many destinations it holds;
//   - per session, at most BytesPerMinute bytes of these records in each
//     minute (the record's size as the log writes it, approximately); the
//     records past it are not written but counted, and each flush that held
//     some back writes one EventSuppressed record for the session saying
//     how many records and denials it held back: excess is never silently
//     lost, and the log's growth per session is bounded by BytesPerMinute
//     plus one such record per flush.
//
// Records of anything else (grants, revokes, approvals, requests) never go
// through here and are never held back.
type Denials struct {
	cfg DenialsConfig
	mu  sync.Mutex
	ses map[string]*sessionDenials
	// Totals since start, for metrics.
	suppressedRecords, suppressedDenials, folded uint64
}

// DenialsConfig bounds the aggregation; zero fields take the defaults.
type DenialsConfig struct {
	MaxKeys        int // distinct keys per session per interval; default 64
	BytesPerMinute int // per session; default 256 KiB
}

// Denial is one denial to aggregate.
type Denial struct {
	Session string
	Type    EventType // EventKernelDenial, or EventDecision for a use-time denial
	Class   string    // the capability class a kernel denial enforces (net.egress, process, ...); its record's Action
	Reason  string
	Proto   string         // tcp, udp (kernel, net classes); the class (use-time)
	Dst     netip.AddrPort // the destination (kernel); zero for use-time
	// Object is what a kernel denial of a class without a destination
	// refused (the process class: the program's path and dev:inode); one
	// record per distinct Object, which goes into the record's Resource.
	Object string
	RuleID string
}

type denialKey struct {
	typ                        EventType
	class, reason, proto, rule string
	object                     string
	prefix                     netip.Prefix // zero: use-time
	overflow                   bool
}

type denialAgg struct {
	n     uint64
	first netip.AddrPort
	many  bool // more than one destination
}

type sessionDenials struct {
	keys                  map[denialKey]*denialAgg
	window                time.Time // start of the current minute
	bytes                 int       // bytes written in it
	heldRecords, heldDens uint64    // held back since the last EventSuppressed
}

// ReasonEventsSuppressed is the Reason of a kernel_denial record that
// counts a session's denials whose events the kernel's per-session event
// budget did not send (their denials are in the kernel's counters; what
// they were of, beyond the session, is not known).
const ReasonEventsSuppressed = "events_suppressed"

// EventSuppressed: records a session's denials would have made past its
// per-minute ceiling (Count: the denials they held).
const EventSuppressed EventType = "audit_suppressed"

// NewDenials returns an empty aggregator.
func NewDenials(cfg DenialsConfig) *Denials {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 64
	}
	if cfg.BytesPerMinute <= 0 {
		cfg.BytesPerMinute = 256 << 10
	}
	return &Denials{cfg: cfg, ses: map[string]*sessionDenials{}}
}

func dstPrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 24
	if a.Is6() {
		bits = 48
	}
	p, _ := a.Prefix(bits)
	return p
}

// Add counts one denial; it never blocks on the log.
func (d *Denials) Add(x Denial) { d.AddN(x, 1) }

// AddN counts n denials of the same key at once (the kernel's count of
// denial events its budget kept from the agent: one record per session and
// interval, Reason ReasonEventsSuppressed).
func (d *Denials) AddN(x Denial, n uint64) {
	if n == 0 {
		return
	}
	k := denialKey{typ: x.Type, class: x.Class, reason: x.Reason, proto: x.Proto, rule: x.RuleID, object: x.Object}
	if x.Dst.IsValid() {
		k.prefix = dstPrefix(x.Dst.Addr())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.ses[x.Session]
	if s == nil {
		s = &sessionDenials{keys: map[denialKey]*denialAgg{}}
		d.ses[x.Session] = s
	}
	a := s.keys[k]
	if a == nil {
		if len(s.keys) >= d.cfg.MaxKeys {
			k = denialKey{typ: x.Type, class: x.Class, reason: x.Reason, proto: x.Proto, overflow: true}
			if a = s.keys[k]; a == nil {
				a = &denialAgg{}
				s.keys[k] = a // one past MaxKeys per (kind, reason, proto) at most
			}
			a.n += n
			d.folded += n
			return
		}
		a = &denialAgg{first: x.Dst}
		s.keys[k] = a
	}
	a.n += n
	if x.Dst != a.first {
		a.many = true
	}
}

// Flush returns the records of the interval that ends at now, each
// session's within its ceiling, and its EventSuppressed record when it held
// any back.
func (d *Denials) Flush(now time.Time) []Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Event
	names := make([]string, 0, len(d.ses))
	for n := range d.ses {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		s := d.ses[name]
		if now.Sub(s.window) >= time.Minute {
			if len(s.keys) == 0 {
				delete(d.ses, name) // quiet for a minute: nothing to remember
				continue
			}
			s.window, s.bytes = now, 0
		}
		for _, k := range sortedKeys(s.keys) {
			a := s.keys[k]
			ev := Event{Type: k.typ, Time: now, Session: name, Action: k.class, Reason: k.reason, RuleID: k.rule, Outcome: "denied", Count: a.n}
			switch {
			case k.overflow:
				ev.Resource = fmt.Sprintf("%s * (destinations past the interval's first %d keys)", k.proto, d.cfg.MaxKeys)
			case k.object != "":
				ev.Resource = k.object
			case !k.prefix.IsValid():
				ev.Resource = k.proto
			case a.many:
				ev.Resource = k.proto + " " + k.prefix.String()
			default:
				ev.Resource = k.proto + " " + a.first.String()
			}
			size := eventSize(ev)
			if s.bytes+size > d.cfg.BytesPerMinute {
				s.heldRecords++
				s.heldDens += a.n
				d.suppressedRecords++
				d.suppressedDenials += a.n
				continue
			}
			s.bytes += size
			out = append(out, ev)
		}
		clear(s.keys)
		if s.heldRecords > 0 {
			out = append(out, Event{Type: EventSuppressed, Time: now, Session: name, Outcome: "suppressed", Count: s.heldDens,
				Reason: fmt.Sprintf("%d denial records held back: the session's audit ceiling of %d bytes a minute", s.heldRecords, d.cfg.BytesPerMinute)})
			s.heldRecords, s.heldDens = 0, 0
		}
	}
	return out
}

// DenialStats are the aggregator's totals since start.
type DenialStats struct {
	SuppressedRecords, SuppressedDenials, Folded uint64
}

// Stats returns the totals.
func (d *Denials) Stats() DenialStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return DenialStats{d.suppressedRecords, d.suppressedDenials, d.folded}
}

func sortedKeys(m map[denialKey]*denialAgg) []denialKey {
	ks := make([]denialKey, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		a, b := ks[i], ks[j]
		if a.overflow != b.overflow {
			return !a.overflow
		}
		if a.typ != b.typ {
			return a.typ < b.typ
		}
		if a.class != b.class {
			return a.class < b.class
		}
		if a.reason != b.reason {
			return a.reason < b.reason
		}
		if a.proto != b.proto {
			return a.proto < b.proto
		}
		if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
			return c < 0
		}
		if a.rule != b.rule {
			return a.rule < b.rule
		}
		return a.object < b.object
	})
	return ks
}

// eventSize is about the size of ev's line in the log: its fields plus the
// fixed part (seq, time, hashes, signature: recordOverhead).
func eventSize(ev Event) int {
	return recordOverhead + len(ev.Session) + len(ev.Action) + len(ev.Reason) + len(ev.Resource) + len(ev.RuleID) + len(ev.Outcome) + len(ev.Type) + 24
}

// recordOverhead: the bytes of a record besides its free-text fields (keys,
// seq, time, prev_hash, signature).
const recordOverhead = 400
