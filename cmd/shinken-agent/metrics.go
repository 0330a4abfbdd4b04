package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/metrics"
)

// metricsState is the daemon's Prometheus registry.
type metricsState struct {
	m *metrics.Metrics
}

// serveMetrics serves /metrics on the configured loopback address: the
// registry (kernel denial counters read at scrape time, grants, handles,
// revokes, maps) followed by the DNS resolver's counters.
func (d *daemon) serveMetrics() (*http.Server, error) {
	ap, err := netip.ParseAddrPort(d.cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("metrics_addr %q: %w", d.cfg.MetricsAddr, err)
	}
	if !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("metrics_addr %s: must be a loopback address (put a proxy in front to expose it)", ap)
	}
	m, err := metrics.New(metrics.Config{Source: d.dp, Logger: d.log})
	if err != nil {
		return nil, err
	}
	d.metrics = &metricsState{m: m}
	m.SetEnforcement(d.dp.Probe())
	if err := m.Registry().Register(auditErrors); err != nil {
		return nil, err
	}
	for _, c := range d.auditDenialMetrics() {
		if err := m.Registry().Register(c); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		d.updateGauges()
		fams, err := m.Registry().Gather()
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, f := range fams {
			enc.Encode(f)
		}
		if d.resolver != nil {
			d.resolver.WriteMetrics(&buf)
		}
		if err != nil {
			d.log.Warn("metrics: gather", "err", err)
		}
		w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
		w.Write(buf.Bytes())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return srv, nil
}

// updateGauges sets the gauges the daemon owns from the agent and dataplane.
func (d *daemon) updateGauges() {
	if d.metrics == nil {
		return
	}
	byClass := map[agent.Class]int{}
	for _, c := range agent.Classes {
		byClass[c] = 0
	}
	handles := 0
	for _, g := range d.ag.Grants("") {
		if g.Phase == agent.PhaseLive {
			byClass[g.Capability.Class]++
			handles++
		}
	}
	for c, n := range byClass {
		d.metrics.m.SetGrantsLive(string(c), n)
	}
	d.metrics.m.SetHandlesLive(handles)
	for _, o := range d.dp.Occupancy() {
		d.metrics.m.SetMap(o.Map, o.Entries, o.Limit)
	}
}

// observeCall takes the agent's latency events: a revoke call, and the
// decision of a request (Cedar, tiers and, when granted, the kernel writes
// of the grant).
func (d *daemon) observeCall(e agent.Event) {
	if d.metrics == nil {
		return
	}
	switch e.Kind {
	case agent.EventRevokeDone:
		d.metrics.m.ObserveRevoke(e.Took)
	case agent.EventRequestDecided:
		d.metrics.m.ObserveDecision(e.Took)
	}
}

func (d *daemon) observeDecision(dt time.Duration) {
	if d.metrics != nil {
		d.metrics.m.ObserveDecision(dt)
	}
}
