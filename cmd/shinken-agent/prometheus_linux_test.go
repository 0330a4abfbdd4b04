package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// promQuery runs an instant query through Prometheus's HTTP API.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func promQuery(t *testing.T, base, q string) []promSample {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" {
		t.Fatalf("query %s: %v %s %s", q, err, r.Status, r.Error)
	}
	return r.Data.Result
}

func sampleValue(s promSample) float64 {
	str, _ := s.Value[1].(string)
	v, _ := strconv.ParseFloat(str, 64)
	return v
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestPrometheus scrapes a real agent with Debian's prometheus binary (and
// the repository's alerting rules loaded): after three denials
// shinken_denials_total, read through Prometheus's HTTP API, says three, and
// the first scrape after the session is removed ends its series.
func TestPrometheus(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no prometheus on PATH in CI: .ci/install-deps installs Debian's prometheus")
		}
		t.Skip("no prometheus on PATH (apt-get install prometheus)")
	}
	e := newEnv(t)
	e.startAgent()
	port := listen(t, "127.0.0.3:0") // never granted
	e.mustCtl("session", "create", "prom", "-image", "e2e")
	e.mustCtl("session", "create", "other", "-image", "e2e")

	rules, err := filepath.Abs("deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: shinken-agent
    static_configs:
      - targets: [%q]
`, rules, e.metrics)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	base := "http://" + addr
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitFor("Prometheus to answer", 20*time.Second, func() bool {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	waitFor("a scrape of the agent", 15*time.Second, func() bool {
		r := promQuery(t, base, `up{job="shinken-agent"}`)
		return len(r) == 1 && sampleValue(r[0]) == 1
	})

	const denials = 3
	for i := 0; i < denials; i++ {
		if e.connect("prom", "127.0.0.3", port) {
			t.Fatal("ungranted destination reachable")
		}
	}
	q := `sum(shinken_denials_total{job="shinken-agent",session="prom"})`
	var got float64
	waitFor(q+" to reach 3", 15*time.Second, func() bool {
		r := promQuery(t, base, q)
		if len(r) == 1 {
			got = sampleValue(r[0])
		}
		return got >= denials
	})
	if got != denials {
		t.Errorf("%s = %v, want %d", q, got, denials)
	}
	r := promQuery(t, base, `shinken_denials_total{session="prom"}`)
	if len(r) != 1 || r[0].Metric["class"] != "net.egress" || r[0].Metric["reason"] != "no_rule" || sampleValue(r[0]) != denials {
		t.Errorf("series: %+v", r)
	}
	if r := promQuery(t, base, `shinken_denials_total{session="other"}`); len(r) != 0 {
		t.Errorf("a session that was denied nothing has series: %+v", r)
	}

	// The alerting rules load and evaluate against the agent's real series.
	waitFor("the alerting rules to evaluate", 10*time.Second, func() bool {
		resp, err := http.Get(base + "/api/v1/rules")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rr struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name, Health, LastError string
					}
				}
			}
		}
		json.NewDecoder(resp.Body).Decode(&rr)
		n := 0
		for _, g := range rr.Data.Groups {
			for _, r := range g.Rules {
				if r.Health == "err" {
					t.Fatalf("rule %s: %s", r.Name, r.LastError)
				}
				if r.Health == "ok" {
					n++
				}
			}
		}
		return n >= 5
	})
	if r := promQuery(t, base, `ALERTS{alertname="ShinkenAgentDown"}`); len(r) != 0 {
		t.Errorf("ShinkenAgentDown while the agent is up: %+v", r)
	}

	// Removing the session ends its series at the next scrape.
	removed := time.Now()
	e.mustCtl("session", "rm", "prom")
	waitFor("a scrape after the removal", 10*time.Second, func() bool {
		r := promQuery(t, base, `timestamp(up{job="shinken-agent"})`)
		return len(r) == 1 && sampleValue(r[0]) > float64(removed.UnixNano())/1e9
	})
	if r := promQuery(t, base, `shinken_denials_total{session="prom"}`); len(r) != 0 {
		t.Errorf("the removed session's series survived the next scrape: %+v", r)
	}
	if r := promQuery(t, base, `shinken_sessions{job="shinken-agent"}`); len(r) != 1 || sampleValue(r[0]) != 1 {
		t.Errorf("shinken_sessions after the removal: %+v", r)
	}
}
