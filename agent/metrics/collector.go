package metrics

import (
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shinken-agent/shinken/agent/backend"
)

// ClassNetEgress and ClassNetInbound are the class labels of the kernel's
// denial counters: no_inbound refusals are net.inbound, the rest net.egress
// (backend.Reason.Class).
const (
	ClassNetEgress  = string(backend.ClassNetEgress)
	ClassNetInbound = string(backend.ClassNetInbound)
)

// classOf is the class label of a denial reason.
func classOf(r backend.Reason) string { return string(r.Class()) }

// kernelCollector reads the dataplane at scrape time.
type kernelCollector struct {
	src  Source
	log  *slog.Logger
	errs atomic.Uint64

	denials      *prometheus.Desc
	unattributed *prometheus.Desc
	sessions     *prometheus.Desc
	drops        *prometheus.Desc
	suppressed   *prometheus.Desc
	readErrors   *prometheus.Desc
	sweeps       *prometheus.Desc
	skipped      *prometheus.Desc
	destroyed    *prometheus.Desc
	sweepErrors  *prometheus.Desc
}

// sweepSource is what a dataplane in sweep flow mode adds to Source.
type sweepSource interface {
	SweepStats() backend.SweepStats
}

func newKernelCollector(src Source, log *slog.Logger) *kernelCollector {
	return &kernelCollector{
		src: src,
		log: log,
		denials: prometheus.NewDesc("shinken_denials_total",
			"Kernel denials by session, capability class and reason (per-CPU counters; none lost to ring-buffer overflow).",
			[]string{"session", "class", "reason"}, nil),
		unattributed: prometheus.NewDesc("shinken_denials_unattributed_total",
			"Kernel denials not tied to a live session (a cgroup under the parent that is no session).",
			[]string{"class", "reason"}, nil),
		sessions: prometheus.NewDesc("shinken_sessions", "Sessions the dataplane knows.", nil, nil),
		drops:    prometheus.NewDesc("shinken_ringbuf_drops_total", "Denial events the kernel ring buffer had no room for (their counts were kept).", nil, nil),
		suppressed: prometheus.NewDesc("shinken_denial_events_suppressed_total",
			"Denial events the session's in-kernel event budget kept from the agent (their denials are in shinken_denials_total).",
			[]string{"session"}, nil),
		readErrors: prometheus.NewDesc("shinken_dataplane_read_errors_total", "Scrape-time reads of kernel maps that failed.", nil, nil),
		sweeps:     prometheus.NewDesc("shinken_flow_sweeps_total", "Socket sweeps run (sweep flow mode: after each revoke, at handle deadlines).", nil, nil),
		skipped:    prometheus.NewDesc("shinken_flow_sweeps_skipped_total", "Revokes and handle deadlines that needed no socket sweep (sweep flow mode): no connect, send, inbound flow or sweep ever tried a rule under the handle or a descendant.", nil, nil),
		destroyed:  prometheus.NewDesc("shinken_flow_sockets_destroyed_total", "Open session sockets the sweeps destroyed because no live grant covered their peer.", nil, nil),
		sweepErrors: prometheus.NewDesc("shinken_flow_sweep_errors_total",
			"Sweeps that failed: new connects stayed denied, but open flows may have lived on.", nil, nil),
	}
}

func (c *kernelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.denials
	ch <- c.unattributed
	ch <- c.sessions
	ch <- c.drops
	ch <- c.readErrors
	if _, ok := c.src.(backend.SuppressedEvents); ok {
		ch <- c.suppressed
	}
	if _, ok := c.src.(sweepSource); ok {
		ch <- c.sweeps
		ch <- c.skipped
		ch <- c.destroyed
		ch <- c.sweepErrors
	}
}

func (c *kernelCollector) Collect(ch chan<- prometheus.Metric) {
	defer func() {
		ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.CounterValue, float64(c.errs.Load()))
	}()
	sessions, err := c.src.Sessions()
	if err != nil {
		c.fail(ch, c.sessions, "list sessions", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(len(sessions)))

	results := c.readCounters(sessions)
	for i, s := range sessions {
		res := results[i]
		if errors.Is(res.err, backend.ErrSessionNotFound) {
			continue // ended since Sessions(): its series go with it
		}
		if res.err != nil {
			c.fail(ch, c.denials, "read counters of "+s.Name, res.err)
			continue
		}
		for r := backend.Reason(1); r < backend.NumReasons; r++ {
			if v := res.cnt[r]; v != 0 {
				ch <- prometheus.MustNewConstMetric(c.denials, prometheus.CounterValue, float64(v), s.Name, classOf(r), r.String())
			}
		}
	}

	if ss, ok := c.src.(backend.SuppressedEvents); ok {
		c.collectSuppressed(ch, ss, sessions)
	}

	if cnt, err := c.src.Counters(0); err != nil {
		c.fail(ch, c.unattributed, "read unattributed counters", err)
	} else {
		for r := backend.Reason(1); r < backend.NumReasons; r++ {
			if v := cnt[r]; v != 0 {
				ch <- prometheus.MustNewConstMetric(c.unattributed, prometheus.CounterValue, float64(v), classOf(r), r.String())
			}
		}
	}

	if ss, ok := c.src.(sweepSource); ok {
		st := ss.SweepStats()
		ch <- prometheus.MustNewConstMetric(c.sweeps, prometheus.CounterValue, float64(st.Sweeps))
		ch <- prometheus.MustNewConstMetric(c.skipped, prometheus.CounterValue, float64(st.Skipped))
		ch <- prometheus.MustNewConstMetric(c.destroyed, prometheus.CounterValue, float64(st.Destroyed))
		ch <- prometheus.MustNewConstMetric(c.sweepErrors, prometheus.CounterValue, float64(st.Errors))
	}

	if n, err := c.src.RingbufDrops(); err != nil {
		c.fail(ch, c.drops, "read ring-buffer drops", err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(n))
	}
}

// collectSuppressed exports each session's suppressed denial events (none
// read when none was suppressed at all).
func (c *kernelCollector) collectSuppressed(ch chan<- prometheus.Metric, ss backend.SuppressedEvents, sessions []backend.Session) {
	total, err := ss.EventsSuppressedTotal()
	if err != nil {
		c.fail(ch, c.suppressed, "read suppressed denial events", err)
		return
	}
	if total == 0 {
		return
	}
	for _, s := range sessions {
		n, err := ss.EventsSuppressed(s.Index)
		if errors.Is(err, backend.ErrSessionNotFound) {
			continue
		}
		if err != nil {
			c.fail(ch, c.suppressed, "read suppressed denial events of "+s.Name, err)
			continue
		}
		if n != 0 {
			ch <- prometheus.MustNewConstMetric(c.suppressed, prometheus.CounterValue, float64(n), s.Name)
		}
	}
}

type countersResult struct {
	cnt [backend.NumReasons]uint64
	err error
}

// batchSource is a Source that reads many sessions' counters in one call
// (the Linux backend: BPF_MAP_LOOKUP_BATCH over runs of the indices the
// kernel marked as having denied; the rest are zero unread), with the
// same results as Counters on each index.
type batchSource interface {
	CountersOf(indices []uint32) ([]backend.Denials, error)
}

// maxReaders bounds the goroutines reading counters in one scrape.
const maxReaders = 8

// readCounters reads every session's counters: in one batched call where
// the source has one (batchSource: at 100,000 sessions one lookup per
// session and reason would be 1,200,000 syscalls a scrape), else one read
// per session, each a handful of map-lookup syscalls, spread over up to
// GOMAXPROCS (at most maxReaders) goroutines.
func (c *kernelCollector) readCounters(sessions []backend.Session) []countersResult {
	out := make([]countersResult, len(sessions))
	if bs, ok := c.src.(batchSource); ok {
		idx := make([]uint32, len(sessions))
		for i, s := range sessions {
			idx[i] = s.Index
		}
		cnt, err := bs.CountersOf(idx)
		for i := range out {
			if err != nil {
				out[i].err = err
			} else {
				out[i].cnt = cnt[i]
			}
		}
		return out
	}
	workers := min(runtime.GOMAXPROCS(0), maxReaders, len(sessions)/256+1)
	var wg sync.WaitGroup
	per := (len(sessions) + workers - 1) / workers
	for lo := 0; lo < len(sessions); lo += per {
		hi := min(lo+per, len(sessions))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				out[i].cnt, out[i].err = c.src.Counters(sessions[i].Index)
			}
		}()
	}
	wg.Wait()
	return out
}

// fail counts and logs a failed read and reports it to the registry (which
// logs it and, with ContinueOnError, serves the rest).
func (c *kernelCollector) fail(ch chan<- prometheus.Metric, d *prometheus.Desc, what string, err error) {
	c.errs.Add(1)
	c.log.Warn("metrics: kernel read failed", "what", what, "error", err)
	ch <- prometheus.NewInvalidMetric(d, err)
}
