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
)

// TestExecDenialEndToEnd: through the daemon, a session given a process
// grant (exec of /bin/sh and /usr/bin/true, through its card) runs true
// and is refused /usr/bin/id; the refusal is counted in
// shinken_denials_total{class="process",reason="exec_denied"} (the allowed
// exec counts nothing) and reaches the audit log as an aggregated
// kernel_denial record with the class, the reason and the program.
func TestExecDenialEndToEnd(t *testing.T) {
	e := newEnv(t)
	if err := os.WriteFile(filepath.Join(e.dir, "manifests", "ex.manifest"), []byte("image ex\nallow process exec=/bin/sh,/usr/bin/true,/usr/bin/id tier=ask\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.startAgent()
	e.mustCtl("session", "create", "ex", "-image", "ex")
	var res []reqResult
	e.ctlJSON(&res, "request", "ex", "process", "-json", `{"class":"process","process":{"exec":["/bin/sh","/usr/bin/true"]}}`)
	if len(res) != 1 || res[0].Outcome != "pending" || res[0].Card == "" {
		t.Fatalf("process request: %+v", res)
	}
	e.mustCtl("approve", res[0].Card, "--session")
	metric := `shinken_denials_total{class="process",reason="exec_denied",session="ex"}`

	if out, err := e.ctl("run", "ex", "--", "/bin/sh", "-c", "/usr/bin/true"); err != nil {
		t.Fatalf("an allowed exec failed: %v: %s", err, out)
	}
	if v, ok := metricValue(scrape(t, e.metrics), metric); ok {
		t.Errorf("an allowed exec counted %v exec denials", v)
	}
	if out, err := e.ctl("run", "ex", "--", "/bin/sh", "-c", "/usr/bin/id"); err == nil {
		t.Fatalf("an exec off the allowlist ran: %s", out)
	}
	body := scrape(t, e.metrics)
	if v, _ := metricValue(body, metric); v != 1 {
		t.Errorf("%s = %v after one refused exec, want 1\n%s", metric, v, grepLines(body, "shinken_denials_total"))
	}

	// The audit log: the daemon flushes aggregated denials every second.
	var rec map[string]any
	for deadline := time.Now().Add(10 * time.Second); rec == nil && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		data, _ := os.ReadFile(filepath.Join(e.dir, "state", audit.LogFile))
		for _, line := range strings.Split(string(data), "\n") {
			var r map[string]any
			if json.Unmarshal([]byte(line), &r) == nil && r["event.name"] == string(audit.EventKernelDenial) && r["session.id"] == "ex" {
				rec = r
			}
		}
	}
	if rec == nil {
		t.Fatal("no kernel_denial record of session ex in the audit log")
	}
	res0 := fmt.Sprint(rec["shinken.resource"])
	if rec["shinken.action"] != "process" || rec["shinken.reason"] != "exec_denied" || fmt.Sprint(rec["shinken.count"]) != "1" || !strings.Contains(res0, "/usr/bin/id") {
		t.Errorf("audit record: %v", rec)
	}
	if strings.Contains(res0, "/usr/bin/true") {
		t.Errorf("the allowed exec is in the audit record: %v", rec)
	}

	// A program the launch cannot execute is the request's fault, not
	// the agent's: 403 for one the allowlist refuses, 400 for one that is
	// not there (both were 500).
	for _, c := range []struct{ prog, want string }{{"/usr/bin/id", "(HTTP 403)"}, {"/usr/bin/no-such-program", "(HTTP 400)"}} {
		if out, err := e.ctl("run", "ex", "--", c.prog); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("run %s: %v: %s, want an error %s", c.prog, err, out, c.want)
		} else {
			t.Logf("verified: run %s: %s", c.prog, strings.TrimSpace(out))
		}
	}
}
