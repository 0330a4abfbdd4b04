package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/dataplane"
)

// TestDenialBudgetEndToEnd: through the daemon, a session refused 3,000
// sends to distinct destinations (far past its default event budget of 500
// at once and 100 a second) has every one counted in
// shinken_denials_total, the events its budget kept from the agent in
// shinken_denial_events_suppressed_total, and the audit log accounts for
// every denial: the counts of its kernel_denial records (the events the
// agent got, aggregated, plus the events_suppressed records) add up to the
// kernel's count, with the suppressed ones saying so.
func TestDenialBudgetEndToEnd(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	e.mustCtl("session", "create", "flood", "-image", "e2e")
	const n = 3000
	script := fmt.Sprintf(`for i in $(seq 0 %d); do echo x 2>/dev/null >/dev/udp/127.0.$((9 + i / 250)).$((i %% 250 + 1))/9; done; echo done`, n-1)
	start := time.Now()
	if out, err := e.ctl("run", "flood", "--", "bash", "-c", script); err != nil || !strings.Contains(out, "done") {
		t.Fatalf("flood: %v\n%s", err, out)
	}
	// The most the budget may have sent: the burst, and the rate over the
	// run (launch included: an upper bound).
	budget := float64(dataplane.DefaultDenialEventBurst) + dataplane.DefaultDenialEventRate*time.Since(start).Seconds() + 1
	body := scrape(t, e.metrics)
	denials, _ := metricValue(body, `shinken_denials_total{class="net.egress",reason="no_rule",session="flood"}`)
	if denials != n {
		t.Fatalf("shinken_denials_total no_rule = %v, want %d\n%s", denials, n, grepLines(body, "shinken_denials_total"))
	}
	sup, _ := metricValue(body, `shinken_denial_events_suppressed_total{session="flood"}`)
	if sup < n-budget || sup >= n {
		t.Errorf("shinken_denial_events_suppressed_total = %v, want at least %d denials less the budget of the run (%.0f), and some events sent", sup, n, budget)
	}

	// The audit log: the daemon flushes aggregated denials every second.
	var got, gotSup float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		got, gotSup = 0, 0
		data, _ := os.ReadFile(filepath.Join(e.dir, "state", audit.LogFile))
		for _, line := range strings.Split(string(data), "\n") {
			var r map[string]any
			if json.Unmarshal([]byte(line), &r) != nil || r["event.name"] != string(audit.EventKernelDenial) || r["session.id"] != "flood" {
				continue
			}
			c, _ := r["shinken.count"].(float64)
			got += c
			if r["shinken.reason"] == audit.ReasonEventsSuppressed {
				gotSup += c
				if !strings.Contains(fmt.Sprint(r["shinken.resource"]), "event budget") {
					t.Errorf("events_suppressed record: %v", r)
				}
			}
		}
		if got == n {
			break
		}
	}
	if got != n || gotSup != sup {
		data, _ := os.ReadFile(filepath.Join(e.dir, "state", audit.LogFile))
		t.Errorf("audit log: kernel_denial counts of session flood add up to %v (%v of them events_suppressed), want %d (%v)\n%s", got, gotSup, n, sup, data)
	}
	if drops, _ := metricValue(body, "shinken_ringbuf_drops_total"); drops != 0 {
		t.Logf("ring buffer drops: %v (the audit sum above can then fall short)", drops)
	}
}
