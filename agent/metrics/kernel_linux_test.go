package metrics

import (
	"fmt"
	"net"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// The tests in this file load the real dataplane into the kernel, as root,
// under a parent cgroup and pin path of their own, and remove it after.

func TestMain(m *testing.M) { kerneltest.Main(m, nil) }

// testConfig is private to one test: its own parent cgroup and pin
// directory, so it never touches a running agent's.
func testConfig() dataplane.Config {
	parent, pin := kerneltest.Private("shinken-mtest-")
	return dataplane.Config{Parent: parent, PinPath: pin, MaxSessions: 1024, MaxHandles: 1024, MaxEgress4: 4096, MaxEgress6: 4096, MaxFlows: 4096}
}

// newDataplane opens a dataplane as root and uninstalls it when the test ends.
func newDataplane(t testing.TB, cfg dataplane.Config) *dataplane.Dataplane {
	t.Helper()
	return kerneltest.Open(t, func() (*dataplane.Dataplane, error) { return dataplane.Open(cfg) })
}

// startProbe starts a probe process inside session s.
func startProbe(t testing.TB, s dataplane.Session, opts dataplane.ProcOptions) *probe.Proc {
	t.Helper()
	return probe.Start(t, func(c *exec.Cmd) error { return dataplane.StartIn(s, c, opts) })
}

// series gathers the registry into "name{k="v",...}" -> value, labels
// sorted by name.
func series(t testing.TB, m *Metrics) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			var ls []string
			for _, l := range mt.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			key := mf.GetName()
			if len(ls) > 0 {
				key += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case mt.Counter != nil:
				out[key] = mt.GetCounter().GetValue()
			case mt.Gauge != nil:
				out[key] = mt.GetGauge().GetValue()
			}
		}
	}
	return out
}

func denialKey(session, reason string) string {
	return fmt.Sprintf(`shinken_denials_total{class="net.egress",reason=%q,session=%q}`, reason, session)
}

// TestRealDenialsScraped: denials a session process really causes show up
// in the scrape under its session, class and reason, exactly counted even
// though the event ring buffer overflowed; a session that denies only after
// a scrape is in the next one; destroying the session removes its series.
func TestRealDenialsScraped(t *testing.T) {
	cfg := testConfig()
	cfg.EventRingBytes = 4096 // the smallest ring: a flood overflows it
	d := newDataplane(t, cfg)
	s, err := d.CreateSession("m-deny", dataplane.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	quietS, err := d.CreateSession("m-quiet", dataplane.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Source: d, Logger: quiet(), NoProcessMetrics: true})
	if err != nil {
		t.Fatal(err)
	}

	// A port nobody granted: no_rule, once, then a flood of them.
	p := startProbe(t, s, dataplane.ProcOptions{})
	if got := p.Do("tcp 127.0.0.9:4242"); got != "err EPERM" {
		t.Fatalf("connect without a grant: %q, want err EPERM", got)
	}
	res := strings.Fields(p.Do("hammer 127.0.0.9:4242 0.3"))
	if len(res) != 3 || res[0] != "ok" || res[1] != "0" {
		t.Fatalf("hammer: %v, want ok 0 FAILURES", res)
	}
	flood, _ := strconv.Atoi(res[2])
	noRule := 1 + flood

	// A granted destination whose handle was revoked: handle_revoked.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	h, err := d.NewHandle(dataplane.HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	if err := d.AllowEgress("m-deny", dataplane.EgressRule{Prefix: netip.MustParsePrefix("127.0.0.2/32"), Proto: dataplane.ProtoTCP, Ports: dataplane.Port(port), Handle: h}); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("tcp " + ln.Addr().String()); got != "ok" {
		t.Fatalf("granted connect: %q", got)
	}
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("tcp " + ln.Addr().String()); got != "err EPERM" {
		t.Fatalf("connect after revoke: %q", got)
	}

	got := series(t, m)
	want := map[string]float64{
		denialKey("m-deny", "no_rule"):        float64(noRule),
		denialKey("m-deny", "handle_revoked"): 1,
		"shinken_sessions":                    2,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.Contains(k, `session="m-quiet"`) {
			t.Errorf("a session without denials has a series: %s", k)
		}
	}
	if d.FlowMode() == dataplane.FlowSweep && got["shinken_flow_sweeps_total"] < 1 {
		t.Errorf("shinken_flow_sweeps_total = %v after a revoke in sweep mode, want >= 1", got["shinken_flow_sweeps_total"])
	}
	drops := got["shinken_ringbuf_drops_total"]
	if drops == 0 {
		t.Errorf("ring buffer drops 0 after %d denials into a 4 KiB ring: the overflow case was not exercised", noRule)
	}
	t.Logf("%d no_rule denials counted exactly while the ring buffer dropped %v events", noRule, drops)

	// The quiet session denies after that scrape: the next one has it
	// (the scrape reads only sessions the kernel marked as having denied).
	pq := startProbe(t, quietS, dataplane.ProcOptions{})
	if got := pq.Do("tcp 127.0.0.9:4242"); got != "err EPERM" {
		t.Fatalf("connect without a grant: %q, want err EPERM", got)
	}
	if got := series(t, m); got[denialKey("m-quiet", "no_rule")] != 1 {
		t.Errorf("%s = %v after its first denial, want 1", denialKey("m-quiet", "no_rule"), got[denialKey("m-quiet", "no_rule")])
	}
	pq.Stop()

	// The same through HTTP, as Prometheus sees it.
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if line := denialKey("m-deny", "handle_revoked") + " 1\n"; !strings.Contains(rec.Body.String(), line) {
		t.Errorf("the scrape lacks %q:\n%s", line, grep(rec.Body.String(), "shinken_"))
	}

	// The session ends: its series go, at the very next scrape.
	p.Stop()
	if err := d.DestroySession("m-deny"); err != nil {
		t.Fatal(err)
	}
	got = series(t, m)
	for k := range got {
		if strings.Contains(k, `session="m-deny"`) {
			t.Errorf("series of a destroyed session: %s", k)
		}
	}
	if got["shinken_sessions"] != 1 {
		t.Errorf("shinken_sessions = %v after destroy, want 1", got["shinken_sessions"])
	}
}

// BenchmarkScrape10k: one full /metrics scrape with 10,000 live sessions on
// the real dataplane, each with a denial counted (so 10,000 denial series),
// gzip-encoded as Prometheus asks for it.
// It fails if a scrape takes 1 s or more.
func BenchmarkScrape10k(b *testing.B) {
	const n = 10000
	cfg := testConfig()
	cfg.MaxSessions = 16384
	d := newDataplane(b, cfg)
	start := time.Now()
	var sessions []dataplane.Session
	for i := 0; i < n; i++ {
		s, err := d.CreateSession(fmt.Sprintf("s%05d", i), dataplane.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	created := time.Since(start)

	// One privileged probe visits every session cgroup and is denied once
	// in each: every session then has a non-zero denial series.
	start = time.Now()
	p := startProbe(b, sessions[0], dataplane.ProcOptions{Privileged: true})
	for _, s := range sessions {
		if got := p.Do("cgmove " + filepath.Join(s.Path, "cgroup.procs")); got != "ok" {
			b.Fatalf("move into %s: %s", s.Name, got)
		}
		if got := p.Do("tcp 127.0.0.9:9"); got != "err EPERM" {
			b.Fatalf("connect from %s: %q, want err EPERM", s.Name, got)
		}
	}
	b.Logf("set up %d sessions in %v, one denial in each in %v", n, created, time.Since(start))

	m, err := New(Config{Source: d, Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	h := m.Handler()
	scrapeOnce := func() (time.Duration, int) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Accept-Encoding", "gzip") // as Prometheus asks
		t0 := time.Now()
		h.ServeHTTP(rec, req)
		dt := time.Since(t0)
		if rec.Code != 200 {
			b.Fatalf("scrape: HTTP %d", rec.Code)
		}
		return dt, rec.Body.Len()
	}
	// Check once what a scrape holds.
	got := series(b, m)
	var denialSeries int
	for k, v := range got {
		if strings.HasPrefix(k, "shinken_denials_total{") && v == 1 {
			denialSeries++
		}
	}
	if denialSeries != n || got["shinken_sessions"] != n {
		b.Fatalf("%d denial series and shinken_sessions %v, want %d each", denialSeries, got["shinken_sessions"], n)
	}

	var worst, total time.Duration
	var size, scrapes int
	for b.Loop() {
		dt, sz := scrapeOnce()
		total += dt
		scrapes++
		size = sz
		worst = max(worst, dt)
	}
	mean := total / time.Duration(scrapes)
	b.ReportMetric(float64(mean.Microseconds())/1000, "ms/scrape")
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms/scrape")
	b.ReportMetric(float64(size), "gzip-bytes/scrape")
	b.Logf("scrape_ms_at_10k_sessions=%.1f (mean of %d; worst %.1f ms; %d bytes)", float64(mean.Microseconds())/1000, scrapes, float64(worst.Microseconds())/1000, size)
	if worst >= time.Second {
		b.Errorf("a scrape at %d sessions took %v, want well under 1 s", n, worst)
	}
}
