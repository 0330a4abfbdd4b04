package main

import "github.com/prometheus/client_golang/prometheus"

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
