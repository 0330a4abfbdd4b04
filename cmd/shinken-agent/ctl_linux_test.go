package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// ctlSplit runs shinkenctl with args exactly as given (the socket flag
// included, wherever the caller puts it) and returns stdout, stderr and the
// exit code.
func (e *env) ctlSplit(args ...string) (string, string, int) {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e.bin, "shinkenctl"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestCtlJSON runs every shinkenctl verb with -o json placed after the verb
// (and the socket flag after it too) and parses what it prints as JSON.
func TestCtlJSON(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	port := strconv.Itoa(listen(t, "127.0.0.2:0"))
	verbs := map[string]bool{}
	// run VERB... -o json -socket S: the global flags after the verb.
	run := func(v any, args ...string) {
		t.Helper()
		verbs[args[0]] = true
		flags := []string{"-o", "json", "--socket=" + e.socket}
		if i := slices.Index(args, "--"); i >= 0 { // after "--" is the command's own
			args = slices.Concat(args[:i], flags, args[i:])
		} else {
			args = append(slices.Clone(args), flags...)
		}
		out, stderr, code := e.ctlSplit(args...)
		if code != 0 {
			t.Fatalf("shinkenctl %s: exit %d\n%s%s", strings.Join(args, " "), code, out, stderr)
		}
		dec := json.NewDecoder(strings.NewReader(out))
		n := 0
		for {
			var x json.RawMessage
			err := dec.Decode(&x)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("shinkenctl %s: not JSON: %v\n%s", strings.Join(args, " "), err, out)
			}
			if n == 0 && v != nil {
				if err := json.Unmarshal(x, v); err != nil {
					t.Fatalf("shinkenctl %s: %v\n%s", strings.Join(args, " "), err, out)
				}
			}
			n++
		}
		if n == 0 {
			t.Fatalf("shinkenctl %s printed nothing", strings.Join(args, " "))
		}
	}

	var st struct {
		Enforcement []map[string]any `json:"enforcement"`
		Slice       string           `json:"agent_cpu_slice"`
	}
	run(&st, "status")
	if len(st.Enforcement) == 0 {
		t.Errorf("status: no enforcement report")
	}
	// The daemon's threads have the default slice, or (before Linux 6.12) status says why not.
	if !strings.Contains(st.Slice, "0.1 ms EEVDF slice on the agent's") && !strings.Contains(st.Slice, "needs Linux 6.12+") {
		t.Errorf("status: agent_cpu_slice %q", st.Slice)
	}
	var sv map[string]any
	run(&sv, "session", "create", "j1", "-image", "e2e")
	if sv["id"] != "j1" {
		t.Errorf("session create: %v", sv)
	}
	var list []map[string]any
	run(&list, "session", "ls")
	run(&sv, "session", "show", "j1")
	var res []reqResult
	run(&res, "request", "j1", "net.egress", "-cidr", "127.0.0.2/32", "-port", port)
	if len(res) != 1 || res[0].Outcome != "granted" {
		t.Fatalf("request: %+v", res)
	}
	parent := res[0].Grant
	var child struct{ ID string }
	run(&child, "attenuate", res[0].Grant.Handle, "j1", "net.egress", "-cidr", "127.0.0.2/32", "-port", port)
	run(&list, "grants", "j1")
	var rr struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	run(&rr, "run", "j1", "--", "echo", "-o", "json")
	if rr.ExitCode != 0 || rr.Stdout != "-o json\n" {
		t.Errorf("run: the command's own arguments were touched: %+v", rr)
	}
	cards := make([]string, 3)
	for i := range cards {
		run(&res, "request", "j1", "net.egress", "-cidr", "127.0.0."+strconv.Itoa(10+i)+"/32")
		cards[i] = res[0].Card
	}
	run(&list, "cards")
	if len(list) != 3 {
		t.Errorf("cards: %v", list)
	}
	run(nil, "approve", cards[0], "--once")
	run(nil, "deny", cards[1])
	run(nil, "cancel", cards[2])
	run(nil, "revoke", "-id", child.ID)
	run(nil, "revoke", parent.Handle)
	run(nil, "events")
	run(nil, "audit", "verify")

	// panel: its first line is {"url": ...}; then it serves until stopped.
	verbs["panel"] = true
	cmd := exec.Command(filepath.Join(e.bin, "shinkenctl"), "panel", "-o", "json", "-socket", e.socket)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	cmd.Process.Kill()
	cmd.Wait()
	var p struct{ URL string }
	if err := json.Unmarshal([]byte(line), &p); err != nil || !strings.HasPrefix(p.URL, "http://127.0.0.1:") {
		t.Errorf("panel -o json: %q %v", line, err)
	}
	run(nil, "session", "rm", "j1")

	for _, v := range []string{"status", "session", "run", "request", "attenuate", "grants", "revoke", "cards", "approve", "deny", "cancel", "events", "audit", "panel"} {
		if !verbs[v] {
			t.Errorf("verb %s not run with -o json", v)
		}
	}
}

// TestCtlErrors: a caller's mistake is a 4xx from the API (never a 500)
// with nothing changed, and shinkenctl says why in one line on stderr and
// exits non-zero.
func TestCtlErrors(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	e.mustCtl("session", "create", "bad", "-image", "e2e")
	before := e.mustCtl("grants", "-o", "json")

	cases := []struct {
		args []string
		want string
	}{
		{[]string{"request", "bad", "net.egress", "-domain", "*.*"}, "HTTP 400"},
		{[]string{"request", "bad", "net.egress", "-cidr", "127.0.0.2/32", "-port", "5-1"}, "HTTP 400"},
		{[]string{"request", "bad", "net.egress", "-cidr", "10.1.2.3/8"}, "HTTP 400"},
		{[]string{"request", "bad", "no.such.class"}, "HTTP 400"},
		{[]string{"session", "create", "cgroup.procs"}, "invalid name"},
		{[]string{"session", "create", "memory.max"}, "invalid name"},
		{[]string{"session", "create", "../etc"}, "invalid name"},
		{[]string{"session", "show", "nosuch"}, "HTTP 404"},
		{[]string{"revoke", "not-a-handle"}, "HTTP 400"},
		{[]string{"approve", "c-nosuch", "--once"}, "HTTP 404"},
		{[]string{"attenuate", "not-a-handle", "bad", "net.egress", "-cidr", "127.0.0.2/32"}, "HTTP 400"},
		{[]string{"revoke", "-bogus"}, "flag provided but not defined"},
		{[]string{"frobnicate"}, "unknown verb"},
		{[]string{"status", "-o", "yaml"}, "want table or json"},
	}
	for _, c := range cases {
		out, stderr, code := e.ctlSplit(append([]string{"-socket", e.socket}, c.args...)...)
		line := strings.TrimRight(stderr, "\n")
		if code == 0 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "shinkenctl: ") || !strings.Contains(line, c.want) || strings.Contains(line, "HTTP 500") {
			t.Errorf("shinkenctl %s: exit %d, stderr %q, stdout %q; want one line with %q", strings.Join(c.args, " "), code, stderr, out, c.want)
		}
	}
	_, stderr, code := e.ctlSplit("-socket", filepath.Join(e.dir, "nosuch.sock"), "status")
	if code == 0 || strings.Count(strings.TrimRight(stderr, "\n"), "\n") != 0 || !strings.Contains(stderr, "cannot reach the agent") {
		t.Errorf("no agent: exit %d %q", code, stderr)
	}

	// The API itself: 4xx for each mistake, never 500.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/requests", `{"requests":[{"session":"bad","capability":{"class":"net.egress","net_egress":{"domains":["*.*"]}},"lifecycle":"session"}]}`},
		{"POST", "/v1/requests", `{"requests":[{"session":"bad","capability":{"class":"net.egress","net_egress":{"cidrs":["127.0.0.2/32"],"ports":[{"lo":5,"hi":1}]}},"lifecycle":"session"}]}`},
		{"POST", "/v1/requests", `{"requests":[{"session":"bad","capability":{"class":"net.egress","net_egress":{"domains":["a..b"]}},"lifecycle":"session"}]}`},
		{"POST", "/v1/requests", `{"requests":[{"session":"bad","capability":{"class":"net.egress"},"lifecycle":"forever"}]}`},
		{"POST", "/v1/sessions", `{"id":"cgroup.procs"}`},
		{"POST", "/v1/sessions", `{"id":"bad"}`},
		{"POST", "/v1/grants/revoke", `{"handle":"x","id":"y"}`},
		{"POST", "/v1/grants/attenuate", `{"parent":"nope","request":{"session":"bad","capability":{"class":"net.egress"}}}`},
		{"POST", "/v1/cards/c-none/approve", `{"mode":"always"}`},
		{"POST", "/v1/sessions/bad/run", `{"argv":[]}`},
	} {
		code, msg := rawAPI(t, e.socket, c.method, c.path, c.body)
		if code < 400 || code > 499 {
			t.Errorf("%s %s %s: HTTP %d, want 4xx\n%s", c.method, c.path, c.body, code, msg)
		}
	}
	if after := e.mustCtl("grants", "-o", "json"); after != before {
		t.Errorf("refused calls changed the grants:\n%s\n->\n%s", before, after)
	}
}
