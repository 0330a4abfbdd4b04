package main

import (
	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/agent/backend"
)

// The kernel's per-session denial-event budget (bpf/events.bpf.h) sends a
// flooding session's denials to the agent only up to its budget; the rest
// are counted in shinken_denials_total all the same, and how many events
// were not sent is counted per session. Each second, before the denial
// records are flushed, the daemon turns each session's new count into one
// kernel_denial record, reason events_suppressed, with that Count: the log
// says how many denials it has no record of, never silently fewer.

// suppressedObject is the Resource of those records.
const suppressedObject = "denial events past the session's in-kernel event budget (counted in shinken_denials_total, not sent to the agent)"

// suppressedSeen is what the daemon last read of the counts.
type suppressedSeen struct {
	init  bool
	total uint64
	last  map[string]suppressedAt // by session name
}

type suppressedAt struct {
	index uint32
	n     uint64
}

// addSuppressed adds to the aggregator each session's events suppressed
// since the last call. The first call, when the audit log opens, only
// reads: what was suppressed before this daemon started was reported by
// the one before (or, for the last second before it stopped, not). Reads every session's count only when the total moved.
func (d *daemon) addSuppressed() {
	src, ok := d.dp.(backend.SuppressedEvents)
	if !ok || d.audit == nil {
		return
	}
	st := &d.audit.sup
	total, err := src.EventsSuppressedTotal()
	if err != nil {
		d.log.Warn("suppressed denial events", "err", err)
		return
	}
	if st.init && total == st.total {
		return
	}
	sessions, err := d.dp.Sessions()
	if err != nil {
		d.log.Warn("suppressed denial events", "err", err)
		return
	}
	next := make(map[string]suppressedAt, len(sessions))
	for _, s := range sessions {
		n, err := src.EventsSuppressed(s.Index)
		if err != nil {
			continue // ended meanwhile
		}
		next[s.Name] = suppressedAt{s.Index, n}
		if !st.init {
			continue
		}
		delta := n // a session new since the last read: its count started at 0
		if prev, ok := st.last[s.Name]; ok && prev.index == s.Index && n >= prev.n {
			delta = n - prev.n
		}
		d.audit.den.AddN(audit.Denial{Session: s.Name, Type: audit.EventKernelDenial, Reason: audit.ReasonEventsSuppressed, Object: suppressedObject}, delta)
	}
	st.init, st.total, st.last = true, total, next
}
