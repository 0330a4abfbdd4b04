package metrics

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/shinken-agent/shinken/agent/backend"
)

// ErrNoSource is returned by New without a Source.
var ErrNoSource = errors.New("metrics: no kernel source")

// Source is what the collector reads from the kernel at scrape time.
// Every backend.Backend is one.
type Source interface {
	Sessions() ([]backend.Session, error)
	Counters(index uint32) (backend.Denials, error)
	RingbufDrops() (uint64, error)
}

// Config configures New.
type Config struct {
	Source Source       // required
	Logger *slog.Logger // nil: slog.Default()
	// NoProcessMetrics leaves out the go_* and process_* collectors (tests
	// that compare whole scrapes).
	NoProcessMetrics bool
}

func (c *Config) validate() error {
	if c.Source == nil {
		return ErrNoSource
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Latency buckets, in seconds: a revoke is one map write (microseconds) but
// the daemon's measurement includes its own bookkeeping and the audit
// append (an fsync, milliseconds); a Cedar decision is tens of
// microseconds to milliseconds.
var (
	RevokeBuckets   = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1}
	DecisionBuckets = []float64{1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1}
)

// Metrics is the daemon's metric registry. Its methods are safe for
// concurrent use.
type Metrics struct {
	reg         *prometheus.Registry
	log         *slog.Logger
	grantsLive  *prometheus.GaugeVec
	handlesLive prometheus.Gauge
	revokes     prometheus.Counter
	revokeDur   prometheus.Histogram
	decisionDur prometheus.Histogram
	mapEntries  *prometheus.GaugeVec
	mapLimit    *prometheus.GaugeVec
	dnsQueries  *prometheus.CounterVec
	enforcement *prometheus.GaugeVec
}

// New builds the registry with the kernel collector over cfg.Source.
func New(cfg Config) (*Metrics, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		log: cfg.Logger,
		grantsLive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shinken_grants_live", Help: "Grants currently in force, by capability class.",
		}, []string{"class"}),
		handlesLive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shinken_handles_live", Help: "Caretaker handles currently live.",
		}),
		revokes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shinken_revokes_total", Help: "Revokes performed.",
		}),
		revokeDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shinken_revoke_duration_seconds", Help: "Time from a revoke request to the kernel write that ends the authority.",
			Buckets: RevokeBuckets,
		}),
		decisionDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shinken_decision_duration_seconds", Help: "Time the decision layer (Cedar and tiers) took per request.",
			Buckets: DecisionBuckets,
		}),
		mapEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shinken_map_entries", Help: "Entries in use in a kernel map.",
		}, []string{"map"}),
		mapLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shinken_map_entries_limit", Help: "Capacity (max_entries) of a kernel map.",
		}, []string{"map"}),
		dnsQueries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shinken_dns_queries_total", Help: "DNS queries from sessions, by result.",
		}, []string{"result"}),
		enforcement: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shinken_enforcement_info", Help: "How each capability class and each session-boundary mechanism is enforced on this host, as probed at start (value 1).",
		}, []string{"class", "mechanism", "level"}),
	}
	cs := []prometheus.Collector{
		newKernelCollector(cfg.Source, cfg.Logger),
		m.grantsLive, m.handlesLive, m.revokes, m.revokeDur, m.decisionDur, m.mapEntries, m.mapLimit, m.dnsQueries, m.enforcement,
	}
	if !cfg.NoProcessMetrics {
		cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	return m, nil
}

// Registry is the registry, for tests and for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats. A
// failed kernel read is logged and counted
// (shinken_dataplane_read_errors_total); the rest of the scrape is served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      slogPrinter{m.log},
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       10 * time.Second,
	})
}

type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.l.Warn("metrics: scrape", "error", fmt.Sprint(v...)) }

// SetGrantsLive sets the number of grants in force for a capability class
// (net.egress, fs.scope, gpu, ...).
func (m *Metrics) SetGrantsLive(class string, n int) {
	m.grantsLive.WithLabelValues(class).Set(float64(n))
}

// SetEnforcement publishes a backend's probe as shinken_enforcement_info:
// one series per capability class (mechanism: the class's mechanism), and
// one per session-boundary mechanism (class "session.boundary").
func (m *Metrics) SetEnforcement(r backend.Report) {
	m.enforcement.Reset()
	for _, s := range r.Classes {
		m.enforcement.WithLabelValues(string(s.Class), s.Mechanism, string(s.Level)).Set(1)
	}
	for _, s := range r.Boundary {
		m.enforcement.WithLabelValues("session.boundary", string(s.Class), string(s.Level)).Set(1)
	}
}

// SetHandlesLive sets the number of live caretaker handles.
func (m *Metrics) SetHandlesLive(n int) { m.handlesLive.Set(float64(n)) }

// ObserveRevoke counts one revoke that took d.
func (m *Metrics) ObserveRevoke(d time.Duration) {
	m.revokes.Inc()
	m.revokeDur.Observe(d.Seconds())
}

// ObserveDecision records one decision that took d.
func (m *Metrics) ObserveDecision(d time.Duration) { m.decisionDur.Observe(d.Seconds()) }

// SetMap sets the occupancy and capacity of a kernel map (sessions,
// handles, egress4, egress6, flows).
func (m *Metrics) SetMap(name string, entries, limit int) {
	m.mapEntries.WithLabelValues(name).Set(float64(entries))
	m.mapLimit.WithLabelValues(name).Set(float64(limit))
}

// DNS query results. Keep result a small closed set: it is a label.
const (
	DNSAllowed  = "allowed"  // answered, addresses fed into the egress maps
	DNSRefused  = "refused"  // name not granted to the session
	DNSNXDomain = "nxdomain" // granted but the name does not exist
	DNSError    = "error"    // upstream failure or malformed query
)

// IncDNSQuery counts one DNS query with the given result.
func (m *Metrics) IncDNSQuery(result string) { m.dnsQueries.WithLabelValues(result).Inc() }
