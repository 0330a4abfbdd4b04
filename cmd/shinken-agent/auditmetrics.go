package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shinken-agent/shinken/agent/audit"
)

type auditDenialStats = audit.DenialStats

// auditErrors counts what threatens the audit chain, for the
// ShinkenAuditChainErrors alert (cmd/shinken-agent/deploy/prometheus):
// an append that failed (the step it recorded failed with it: fail closed),
// a verification that found problems, and a torn tail repaired at start.
var auditErrors = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shinken_audit_errors_total",
		Help: "Audit log problems: op=append (a record could not be written), verify (a verification found problems), recover (a torn tail was repaired at start).",
	}, []string{"op"})
	for _, op := range []string{"append", "verify", "recover"} {
		c.WithLabelValues(op) // exported at 0 from the start, so increase() sees the first one
	}
	return c
}()

// auditErr counts err (when not nil) under op and returns it.
func auditErr(op string, err error) error {
	if err != nil {
		auditErrors.WithLabelValues(op).Inc()
	}
	return err
}

// auditDenialMetrics are the denial aggregator's totals (audit.Denials):
// what its per-session ceiling held back (records, and the denials they
// counted; each also counted in an audit_suppressed record of the log), and
// the denials folded into a session's catch-all record past its distinct
// keys of a second.
func (d *daemon) auditDenialMetrics() []prometheus.Collector {
	stat := func(f func(s auditDenialStats) uint64) func() float64 {
		return func() float64 {
			if d.audit == nil {
				return 0
			}
			return float64(f(d.audit.den.Stats()))
		}
	}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shinken_audit_denial_records_held_total",
			Help: "Denial records the per-session audit ceiling held back (each flush that held some writes an audit_suppressed record)."},
			stat(func(s auditDenialStats) uint64 { return s.SuppressedRecords })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shinken_audit_denials_held_total",
			Help: "Denials counted by the records the per-session audit ceiling held back."},
			stat(func(s auditDenialStats) uint64 { return s.SuppressedDenials })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shinken_audit_denials_folded_total",
			Help: "Denials folded into a session's catch-all record, past its distinct destination keys of a second."},
			stat(func(s auditDenialStats) uint64 { return s.Folded })),
	}
}
