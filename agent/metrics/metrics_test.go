package metrics

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shinken-agent/shinken/dataplane"
)

// fakeSource is a Source for the pure tests: sessions and counters as data.
type fakeSource struct {
	mu          sync.Mutex
	sessions    []dataplane.Session
	counters    map[uint32][dataplane.NumReasons]uint64
	drops       uint64
	sessionsErr error
	countersErr map[uint32]error
}

func (f *fakeSource) Sessions() ([]dataplane.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]dataplane.Session(nil), f.sessions...), f.sessionsErr
}

func (f *fakeSource) Counters(index uint32) (dataplane.Denials, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.countersErr[index]; err != nil {
		return [dataplane.NumReasons]uint64{}, err
	}
	return f.counters[index], nil
}

func (f *fakeSource) RingbufDrops() (uint64, error) { return f.drops, nil }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTest(t *testing.T, src Source) *Metrics {
	t.Helper()
	m, err := New(Config{Source: src, Logger: quiet(), NoProcessMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func counts(kv ...uint64) [dataplane.NumReasons]uint64 {
	var c [dataplane.NumReasons]uint64
	for i := 0; i+1 < len(kv); i += 2 {
		c[kv[i]] = kv[i+1]
	}
	return c
}

func TestNewNeedsSource(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrNoSource) {
		t.Errorf("New without a source: %v, want ErrNoSource", err)
	}
}

// TestKernelSeries: what the collector exports for a given kernel state.
func TestKernelSeries(t *testing.T) {
	const header = `
# HELP shinken_denials_total Kernel denials by session, capability class and reason (per-CPU counters; none lost to ring-buffer overflow).
# TYPE shinken_denials_total counter
`
	cases := []struct {
		name string
		src  *fakeSource
		want string
	}{
		{"no sessions", &fakeSource{}, `
# HELP shinken_sessions Sessions the dataplane knows.
# TYPE shinken_sessions gauge
shinken_sessions 0
# HELP shinken_ringbuf_drops_total Denial events the kernel ring buffer had no room for (their counts were kept).
# TYPE shinken_ringbuf_drops_total counter
shinken_ringbuf_drops_total 0
`},
		{"counts by reason, zeros left out", &fakeSource{
			sessions: []dataplane.Session{{Name: "a", Index: 1}, {Name: "b", Index: 2}, {Name: "quiet", Index: 3}},
			counters: map[uint32][dataplane.NumReasons]uint64{
				1: counts(uint64(dataplane.ReasonNoRule), 5, uint64(dataplane.ReasonHandleRevoked), 2),
				2: counts(uint64(dataplane.ReasonFlowRevoked), 7, uint64(dataplane.ReasonNoInbound), 4),
			},
			drops: 42,
		}, header + `shinken_denials_total{class="net.egress",reason="handle_revoked",session="a"} 2
shinken_denials_total{class="net.egress",reason="no_rule",session="a"} 5
shinken_denials_total{class="net.egress",reason="flow_revoked",session="b"} 7
shinken_denials_total{class="net.inbound",reason="no_inbound",session="b"} 4
# HELP shinken_sessions Sessions the dataplane knows.
# TYPE shinken_sessions gauge
shinken_sessions 3
# HELP shinken_ringbuf_drops_total Denial events the kernel ring buffer had no room for (their counts were kept).
# TYPE shinken_ringbuf_drops_total counter
shinken_ringbuf_drops_total 42
`},
		{"unattributed denials", &fakeSource{
			counters: map[uint32][dataplane.NumReasons]uint64{0: counts(uint64(dataplane.ReasonUnknownSession), 3)},
		}, `
# HELP shinken_denials_unattributed_total Kernel denials not tied to a live session (a cgroup under the parent that is no session).
# TYPE shinken_denials_unattributed_total counter
shinken_denials_unattributed_total{class="net.egress",reason="unknown_session"} 3
# HELP shinken_sessions Sessions the dataplane knows.
# TYPE shinken_sessions gauge
shinken_sessions 0
`},
		{"a session that ended during the scrape", &fakeSource{
			sessions:    []dataplane.Session{{Name: "gone", Index: 1}, {Name: "here", Index: 2}},
			counters:    map[uint32][dataplane.NumReasons]uint64{2: counts(1, 1)},
			countersErr: map[uint32]error{1: fmt.Errorf("%w: index 1", dataplane.ErrSessionNotFound)},
		}, header + `shinken_denials_total{class="net.egress",reason="no_rule",session="here"} 1
# HELP shinken_dataplane_read_errors_total Scrape-time reads of kernel maps that failed.
# TYPE shinken_dataplane_read_errors_total counter
shinken_dataplane_read_errors_total 0
`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newTest(t, tc.src)
			names := []string{"shinken_denials_total", "shinken_denials_unattributed_total"}
			for _, n := range []string{"shinken_sessions", "shinken_ringbuf_drops_total", "shinken_dataplane_read_errors_total"} {
				if strings.Contains(tc.want, n) {
					names = append(names, n)
				}
			}
			if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(tc.want), names...); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestSessionSeriesGoWithSession: no stale series once a session ends.
func TestSessionSeriesGoWithSession(t *testing.T) {
	src := &fakeSource{
		sessions: []dataplane.Session{{Name: "a", Index: 1}, {Name: "b", Index: 2}},
		counters: map[uint32][dataplane.NumReasons]uint64{1: counts(1, 3), 2: counts(1, 4)},
	}
	m := newTest(t, src)
	if n, err := testutil.GatherAndCount(m.Registry(), "shinken_denials_total"); err != nil || n != 2 {
		t.Fatalf("%d series (%v), want 2", n, err)
	}
	src.mu.Lock()
	src.sessions = src.sessions[1:]
	src.mu.Unlock()
	out := scrape(t, m)
	if strings.Contains(out, `session="a"`) || !strings.Contains(out, `session="b"`) {
		t.Errorf("after a ended:\n%s", grep(out, "shinken_denials_total"))
	}
}

// TestReadErrors: a failed kernel read is counted and reported, and the
// rest of the scrape is still served.
func TestReadErrors(t *testing.T) {
	cases := []struct {
		name        string
		src         *fakeSource
		wantSeries  []string
		wantMissing []string
	}{
		{"sessions unreadable", &fakeSource{sessionsErr: errors.New("map gone")},
			[]string{"shinken_dataplane_read_errors_total 1", "shinken_handles_live 3"},
			[]string{"shinken_sessions "}},
		{"one session's counters unreadable", &fakeSource{
			sessions:    []dataplane.Session{{Name: "bad", Index: 1}, {Name: "good", Index: 2}},
			counters:    map[uint32][dataplane.NumReasons]uint64{2: counts(1, 9)},
			countersErr: map[uint32]error{1: errors.New("EIO")},
		}, []string{"shinken_dataplane_read_errors_total 1", `shinken_denials_total{class="net.egress",reason="no_rule",session="good"} 9`, "shinken_sessions 2"},
			[]string{`session="bad"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newTest(t, tc.src)
			m.SetHandlesLive(3)
			out := scrape(t, m)
			for _, s := range tc.wantSeries {
				if !strings.Contains(out, s+"\n") {
					t.Errorf("scrape lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tc.wantMissing {
				if strings.Contains(out, s) {
					t.Errorf("scrape has %q:\n%s", s, out)
				}
			}
		})
	}
}

// TestDaemonMetrics: the metrics the daemon updates, their names, types and
// units, and that they pass promlint.
func TestDaemonMetrics(t *testing.T) {
	m := newTest(t, &fakeSource{})
	m.SetGrantsLive("net.egress", 4)
	m.SetGrantsLive("gpu", 1)
	m.SetHandlesLive(6)
	m.ObserveRevoke(30 * time.Microsecond)
	m.ObserveRevoke(2 * time.Millisecond)
	m.ObserveDecision(40 * time.Microsecond)
	m.SetMap("egress4", 100, 2097152)
	m.IncDNSQuery(DNSAllowed)
	m.IncDNSQuery(DNSAllowed)
	m.IncDNSQuery(DNSRefused)
	want := `
# HELP shinken_grants_live Grants currently in force, by capability class.
# TYPE shinken_grants_live gauge
shinken_grants_live{class="gpu"} 1
shinken_grants_live{class="net.egress"} 4
# HELP shinken_handles_live Caretaker handles currently live.
# TYPE shinken_handles_live gauge
shinken_handles_live 6
# HELP shinken_revokes_total Revokes performed.
# TYPE shinken_revokes_total counter
shinken_revokes_total 2
# HELP shinken_map_entries Entries in use in a kernel map.
# TYPE shinken_map_entries gauge
shinken_map_entries{map="egress4"} 100
# HELP shinken_map_entries_limit Capacity (max_entries) of a kernel map.
# TYPE shinken_map_entries_limit gauge
shinken_map_entries_limit{map="egress4"} 2.097152e+06
# HELP shinken_dns_queries_total DNS queries from sessions, by result.
# TYPE shinken_dns_queries_total counter
shinken_dns_queries_total{result="allowed"} 2
shinken_dns_queries_total{result="refused"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"shinken_grants_live", "shinken_handles_live", "shinken_revokes_total", "shinken_map_entries", "shinken_map_entries_limit", "shinken_dns_queries_total"); err != nil {
		t.Error(err)
	}
	out := scrape(t, m)
	for _, s := range []string{
		`shinken_revoke_duration_seconds_bucket{le="2.5e-05"} 0`,
		`shinken_revoke_duration_seconds_bucket{le="5e-05"} 1`,
		`shinken_revoke_duration_seconds_bucket{le="0.0025"} 2`,
		`shinken_revoke_duration_seconds_count 2`,
		`shinken_decision_duration_seconds_bucket{le="5e-05"} 1`,
		`shinken_decision_duration_seconds_count 1`,
	} {
		if !strings.Contains(out, s+"\n") {
			t.Errorf("scrape lacks %q", s)
		}
	}
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestProcessMetrics: the default registry carries the process collector
// (the daemon's RSS at scale is read from it).
func TestProcessMetrics(t *testing.T) {
	m, err := New(Config{Source: &fakeSource{}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if out := scrape(t, m); !strings.Contains(out, "process_resident_memory_bytes ") || !strings.Contains(out, "go_goroutines ") {
		t.Error("no process_resident_memory_bytes / go_goroutines in the scrape")
	}
}

// scrape GETs /metrics through Handler, as Prometheus does.
func scrape(t testing.TB, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape: HTTP %d: %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// batchFake is a fakeSource with the batched read (the Linux backend's
// CountersOf): the collector reads every session's counters through it, in
// one call, and serves the same series as through Counters.
type batchFake struct {
	*fakeSource
	calls    int
	batchErr error
}

func (b *batchFake) CountersOf(indices []uint32) ([]dataplane.Denials, error) {
	b.calls++
	if b.batchErr != nil {
		return nil, b.batchErr
	}
	out := make([]dataplane.Denials, len(indices))
	for i, idx := range indices {
		out[i] = b.counters[idx]
	}
	return out, nil
}

func TestBatchedCounters(t *testing.T) {
	// Counters of a session's index fails: only the batch may read them.
	src := &batchFake{fakeSource: &fakeSource{
		sessions:    []dataplane.Session{{Name: "a", Index: 1}, {Name: "b", Index: 2}},
		counters:    map[uint32][dataplane.NumReasons]uint64{1: counts(1, 3), 2: counts(uint64(dataplane.ReasonNoInbound), 4)},
		countersErr: map[uint32]error{1: errors.New("read one by one"), 2: errors.New("read one by one")},
	}}
	m := newTest(t, src)
	out := scrape(t, m)
	for _, s := range []string{`shinken_denials_total{class="net.egress",reason="no_rule",session="a"} 3`,
		`shinken_denials_total{class="net.inbound",reason="no_inbound",session="b"} 4`, "shinken_dataplane_read_errors_total 0"} {
		if !strings.Contains(out, s+"\n") {
			t.Errorf("scrape lacks %q:\n%s", s, out)
		}
	}
	if src.calls != 1 {
		t.Errorf("%d batched reads in one scrape, want 1", src.calls)
	}
	// A failed batch: counted and reported, no session's series served.
	src.batchErr = errors.New("EIO")
	out = scrape(t, m)
	if !strings.Contains(out, "shinken_dataplane_read_errors_total 2\n") || strings.Contains(out, `session="a"`) {
		t.Errorf("after a failed batch:\n%s", grep(out, "shinken_d"))
	}
}
