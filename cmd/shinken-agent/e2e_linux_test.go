package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/agent/audit"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// The end-to-end test drives the real daemon binary only through shinkenctl
// (and observes the kernel with probe processes in the session).

func TestMain(m *testing.M) {
	code := kerneltest.Run(m, nil)
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

type env struct {
	t         *testing.T
	bin       string // directory of shinken-agent, shinkenctl and the probe
	dir       string
	parent    string
	pin       string
	socket    string
	metrics   string
	upstream  string
	agent     *exec.Cmd
	config    string     // config file to pass, "" for none
	extra     []string   // more flags for the next start
	inherit   []*os.File // descriptors the next start inherits, from fd 3
	setsid    bool       // the next start leads its own session, as under a service manager
	env       []string   // more environment for the next start
	agentLog  *bytes.Buffer
	logMu     sync.Mutex
	cgroupDir string
}

var buildOnce sync.Once
var buildDir string
var buildErr error

func build(t *testing.T) string {
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "shinken-e2e-bin-")
		if buildErr != nil {
			return
		}
		os.Chmod(buildDir, 0o755)
		out, err := exec.Command("go", "build", "-o", buildDir+"/", "github.com/shinken-agent/shinken/cmd/shinken-agent", "github.com/shinken-agent/shinken/cmd/shinkenctl").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v: %s", err, out)
			return
		}
		// The shim and the session init without cgo, as make build makes them.
		static := exec.Command("go", "build", "-o", buildDir+"/", "github.com/shinken-agent/shinken/cmd/shinken-launch", "github.com/shinken-agent/shinken/cmd/shinken-shim")
		static.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := static.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v: %s", err, out)
			return
		}
		// The C launcher of session processes, as make build makes it.
		if out, err := exec.Command("../shinken-exec/build", filepath.Join(buildDir, "shinken-exec")).CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build the C launcher: %v: %s", err, out)
			return
		}
		self, _ := os.Executable()
		data, err := os.ReadFile(self)
		if err == nil {
			err = os.WriteFile(filepath.Join(buildDir, "probe"), data, 0o755)
		}
		buildErr = err
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func newEnv(t *testing.T) *env {
	kerneltest.RequireRoot(t)
	parent, pin := kerneltest.Private("shinken-e2e-")
	e := &env{t: t, bin: build(t), dir: t.TempDir(), parent: parent, pin: pin}
	e.socket = filepath.Join(e.dir, "run", "agent.sock")
	e.upstream = fakeUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.metrics = ln.Addr().String()
	ln.Close()
	os.MkdirAll(filepath.Join(e.dir, "manifests"), 0o755)
	manifest := `# e2e image
image e2e
allow net.egress cidrs=127.0.0.2/32
allow net.egress cidrs=127.0.0.3/32 tier=ask
allow net.egress domains=**.shinken.test cidrs=127.0.0.4/32 tier=ask
allow net.egress cidrs=127.0.0.0/24 tier=ask
`
	if err := os.WriteFile(filepath.Join(e.dir, "manifests", "e2e.manifest"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := dataplane.FindCgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	e.cgroupDir = filepath.Join(root, e.parent)
	t.Cleanup(func() {
		e.stopAgent(syscall.SIGKILL)
		out, err := exec.Command(filepath.Join(e.bin, "shinken-agent"), "-cgroup-parent", e.parent, "-pin-path", e.pin, "-uninstall").CombinedOutput()
		if err != nil {
			t.Errorf("uninstall: %v: %s", err, out)
		}
		if t.Failed() {
			e.logMu.Lock()
			t.Logf("agent log:\n%s", e.agentLog.String())
			e.logMu.Unlock()
		}
	})
	return e
}

type lockedBuf struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (e *env) startAgent() {
	e.t.Helper()
	if e.agentLog == nil {
		e.agentLog = &bytes.Buffer{}
	}
	args := []string{"-config", e.config, // "": no config file, embedded defaults plus these flags
		"-state-dir", filepath.Join(e.dir, "state"), "-socket", e.socket, "-metrics-addr", e.metrics,
		"-policy-dir", filepath.Join(e.dir, "policy"), "-manifest-dir", filepath.Join(e.dir, "manifests"),
		"-cgroup-parent", e.parent, "-pin-path", e.pin, "-dns-listen", "0.0.0.0:0", "-dns-upstreams", e.upstream}
	cmd := exec.Command(filepath.Join(e.bin, "shinken-agent"), append(args, e.extra...)...)
	cmd.Stdout = lockedBuf{&e.logMu, e.agentLog}
	cmd.Stderr = lockedBuf{&e.logMu, e.agentLog}
	cmd.ExtraFiles = e.inherit
	if len(e.env) > 0 {
		cmd.Env = append(os.Environ(), e.env...)
	}
	if e.setsid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.agent = cmd
	// Up to a minute: a start loads and verifies the BPF objects, which on
	// a loaded 2-core machine took over the 10 s this once allowed.
	for i := 0; i < 1200; i++ {
		if out, err := e.ctl("status"); err == nil && strings.Contains(out, "net.egress") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.logMu.Lock()
	defer e.logMu.Unlock()
	e.t.Fatalf("agent did not come up:\n%s", e.agentLog.String())
}

// statusString is the string field name of the agent's status (GET
// /v1/status through shinkenctl).
func (e *env) statusString(name string) string {
	e.t.Helper()
	out := e.mustCtl("status", "-o", "json")
	var st map[string]any
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&st); err != nil {
		e.t.Fatalf("status: %v\n%s", err, out)
	}
	v, _ := st[name].(string)
	return v
}

func (e *env) stopAgent(sig syscall.Signal) {
	if e.agent == nil || e.agent.Process == nil {
		return
	}
	e.agent.Process.Signal(sig)
	e.agent.Wait()
	e.agent = nil
}

// ctl runs shinkenctl and returns its combined output.
func (e *env) ctl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(e.bin, "shinkenctl"), append([]string{"-socket", e.socket}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *env) mustCtl(args ...string) string {
	e.t.Helper()
	out, err := e.ctl(args...)
	if err != nil {
		e.t.Fatalf("shinkenctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (e *env) ctlJSON(v any, args ...string) {
	e.t.Helper()
	out := e.mustCtl(append([]string{"-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("shinkenctl %v: %v\n%s", args, err, out)
	}
}

// connect runs bash inside the session (through shinkenctl run) to open a TCP
// connection; it reports whether the kernel let it through.
func (e *env) connect(session, host string, port int) bool {
	e.t.Helper()
	out, err := e.ctl("run", session, "--", "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%d && echo CONNECTED", host, port))
	if err == nil && strings.Contains(out, "CONNECTED") {
		return true
	}
	if !strings.Contains(out, "Operation not permitted") {
		e.t.Fatalf("connect %s:%d from %s: unexpected failure: %v\n%s", host, port, session, err, out)
	}
	return false
}

func fakeUpstream(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc("shinken.test.", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if q.Qtype == dns.TypeA && q.Name == "api.shinken.test." {
			rr, _ := dns.NewRR("api.shinken.test. 60 IN A 127.0.0.4")
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

func listen(t *testing.T, addr string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func scrape(t *testing.T, addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue finds the value of the series whose line starts with prefix.
func metricValue(body, prefix string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, prefix) {
			f := strings.Fields(l)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

type grantRow struct {
	ID    string `json:"id"`
	Phase string `json:"phase"`
	Cap   struct {
		Egress struct {
			Domains []string `json:"domains"`
			CIDRs   []string `json:"cidrs"`
		} `json:"net_egress"`
	} `json:"capability"`
}

type cardRow struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

type reqResult struct {
	Outcome string `json:"outcome"`
	Card    string `json:"card"`
	Reason  string `json:"reason"`
	Grant   struct {
		ID     string `json:"id"`
		Handle string `json:"handle"`
	} `json:"grant"`
}

func TestEndToEnd(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	pA := listen(t, "127.0.0.2:0") // auto-granted
	pB := listen(t, "127.0.0.3:0") // never granted
	pD := listen(t, "127.0.0.4:0") // api.shinken.test, through a card

	e.mustCtl("session", "create", "e2e", "-image", "e2e")
	var sessions []map[string]any
	e.ctlJSON(&sessions, "session", "ls")
	if len(sessions) != 1 || sessions[0]["id"] != "e2e" {
		t.Fatalf("session ls: %v", sessions)
	}

	// Auto tier: granted at once.
	var res []reqResult
	e.ctlJSON(&res, "request", "e2e", "net.egress", "-cidr", "127.0.0.2/32", "-port", strconv.Itoa(pA))
	if len(res) != 1 || res[0].Outcome != "granted" {
		t.Fatalf("auto request: %+v", res)
	}
	denied := 0
	if !e.connect("e2e", "127.0.0.2", pA) {
		t.Fatal("granted destination refused")
	}
	for i := 0; i < 3; i++ {
		if e.connect("e2e", "127.0.0.3", pB) {
			t.Fatal("ungranted destination reachable")
		}
		denied++
	}

	// A domain through an approval card.
	e.ctlJSON(&res, "request", "e2e", "net.egress", "-domain", "api.shinken.test", "-cidr", "127.0.0.4/32", "-port", strconv.Itoa(pD))
	if len(res) != 1 || res[0].Outcome != "pending" || res[0].Card == "" {
		t.Fatalf("ask request: %+v", res)
	}
	card := res[0].Card
	if out := e.mustCtl("cards"); !strings.Contains(out, card) || !strings.Contains(out, "api.shinken.test") || !strings.Contains(out, "ask") {
		t.Fatalf("cards table lacks the card:\n%s", out)
	}
	e.mustCtl("approve", card, "--session")
	out := e.mustCtl("run", "e2e", "--", "getent", "ahostsv4", "api.shinken.test")
	if !strings.Contains(out, "127.0.0.4") {
		t.Fatalf("getent through the redirected resolver: %q", out)
	}
	if !e.connect("e2e", "127.0.0.4", pD) {
		t.Fatal("domain granted through the card, resolved, but refused")
	}
	// A name not granted is refused by the resolver.
	if out, err := e.ctl("run", "e2e", "--", "getent", "ahostsv4", "evil.example.org"); err == nil {
		t.Fatalf("a name never granted resolved: %s", out)
	}

	// Revoke cuts the next connection.
	var grants []grantRow
	e.ctlJSON(&grants, "grants", "e2e")
	var domGrant string
	for _, g := range grants {
		if g.Phase == "live" && len(g.Cap.Egress.Domains) > 0 {
			domGrant = g.ID
		}
	}
	if domGrant == "" {
		t.Fatalf("no live domain grant in %+v", grants)
	}
	e.mustCtl("revoke", "-id", domGrant)
	if e.connect("e2e", "127.0.0.4", pD) {
		t.Fatal("revoked domain grant still connects")
	}
	denied++

	// Metrics: the kernel's denial counts match what was done.
	body := scrape(t, e.metrics)
	var total float64
	for _, reason := range []string{"no_rule", "handle_revoked"} {
		v, _ := metricValue(body, fmt.Sprintf(`shinken_denials_total{class="net.egress",reason="%s",session="e2e"}`, reason))
		total += v
	}
	if int(total) != denied {
		t.Errorf("shinken_denials_total for e2e = %v, want %d\n%s", total, denied, grepLines(body, "shinken_denials_total"))
	}
	for _, m := range []string{"shinken_audit_denial_records_held_total", "shinken_audit_denials_held_total", "shinken_audit_denials_folded_total"} {
		if _, ok := metricValue(body, m); !ok {
			t.Errorf("%s not exported", m)
		}
	}

	// Bad input: a 4xx with a reason, and nothing changes.
	before := e.mustCtl("-o", "json", "grants", "e2e")
	if out, err := e.ctl("request", "e2e", "net.egress", "-cidr", "10.1.2.3/8"); err == nil || !strings.Contains(out, "invalid") {
		t.Errorf("malformed prefix: err=%v\n%s", err, out)
	}
	if out, err := e.ctl("request", "nosuch", "net.egress", "-cidr", "127.0.0.2/32"); err == nil {
		t.Errorf("unknown session accepted:\n%s", out)
	}
	if out, err := e.ctl("session", "create", "../etc"); err == nil || !strings.Contains(out, "HTTP 400") {
		t.Errorf("bad session name: err=%v\n%s", err, out)
	}
	if after := e.mustCtl("-o", "json", "grants", "e2e"); after != before {
		t.Errorf("a bad request changed the grants:\n%s\n->\n%s", before, after)
	}
	if code, msg := rawAPI(t, e.socket, "POST", "/v1/sessions", "{bad json"); code != 400 || !strings.Contains(msg, "body") {
		t.Errorf("malformed JSON: %d %s", code, msg)
	}

	// Quotas: enforced where cgroup2 has the controllers, refused (and no
	// session made) where it does not, as on hybrid hosts.
	root, _ := dataplane.FindCgroup2Mount()
	ctrls, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	out, err := e.ctl("session", "create", "quota", "-image", "e2e", "-memory", "268435456", "-pids", "64")
	if strings.Contains(string(ctrls), "memory") && strings.Contains(string(ctrls), "pids") {
		if err != nil {
			t.Errorf("quota session on a host with the controllers: %v\n%s", err, out)
		} else if b, _ := os.ReadFile(filepath.Join(e.cgroupDir, "quota", "memory.max")); strings.TrimSpace(string(b)) != "268435456" {
			t.Errorf("memory.max = %q", b)
		}
	} else {
		if err == nil || !strings.Contains(out, "not enforceable") || !strings.Contains(out, "HTTP 422") {
			t.Errorf("quota on a host without cgroup2 memory/pids controllers: err=%v\n%s", err, out)
		}
		if _, serr := os.Stat(filepath.Join(e.cgroupDir, "quota")); serr == nil {
			t.Errorf("a refused quota session left its cgroup")
		}
	}

	// A non-operator uid gets a clear permission error.
	cmd := exec.Command(filepath.Join(e.bin, "shinkenctl"), "-socket", e.socket, "status")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "permission denied") {
		t.Errorf("nobody reached the API: err=%v\n%s", err, out)
	}
	// Even root inside a session is refused by the API.
	sess := dataplane.Session{Name: "e2e", Path: filepath.Join(e.cgroupDir, "e2e")}
	inside := exec.Command(filepath.Join(e.bin, "shinkenctl"), "-socket", e.socket, "status")
	var ib bytes.Buffer
	inside.Stdout, inside.Stderr = &ib, &ib
	if err := dataplane.StartIn(sess, inside, dataplane.ProcOptions{Privileged: true}); err != nil {
		t.Fatal(err)
	}
	if err := inside.Wait(); err == nil || !strings.Contains(ib.String(), "inside a session") {
		t.Errorf("root inside a session reached the API: err=%v\n%s", err, ib.String())
	}

	// The audit log verifies, and one edited record is found and named.
	if out := e.mustCtl("audit", "verify"); !strings.Contains(out, "OK") {
		t.Fatalf("audit verify: %s", out)
	}
	if out := e.mustCtl("audit", "verify", "-full"); !strings.Contains(out, "OK") {
		t.Fatalf("audit verify -full: %s", out)
	}
	if out := e.mustCtl("audit", "verify"); !strings.Contains(out, "OK") { // incremental, from the last one
		t.Fatalf("audit verify again: %s", out)
	}
	if out, err := e.ctl("audit", "verify", "-fast"); err == nil || !strings.Contains(out, "usage") {
		t.Errorf("audit verify -fast: err=%v\n%s", err, out)
	}
	logPath := filepath.Join(e.dir, "state", audit.LogFile)
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) < 5 {
		t.Fatalf("audit log has %d records", len(lines))
	}
	victim := len(lines) / 2
	lines[victim] = strings.Replace(lines[victim], `"seq":`, `"seq": `, 1)
	if !strings.Contains(lines[victim], `"seq": `) {
		t.Fatalf("could not tamper with record %d: %s", victim, lines[victim])
	}
	tampered := strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(logPath, []byte(tampered), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = e.ctl("audit", "verify")
	if err == nil || !strings.Contains(out, "FAILED") || !strings.Contains(out, fmt.Sprintf("seq %d", victim+1)) && !strings.Contains(out, fmt.Sprintf("record %d", victim+1)) {
		t.Errorf("tampered record %d not named: err=%v\n%s", victim+1, err, out)
	}
	os.WriteFile(logPath, data, 0o600)
}

func grepLines(body, pat string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, pat) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func rawAPI(t *testing.T, socket, method, path, body string) (int, string) {
	hc := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", socket) }}}
	req, _ := http.NewRequest(method, "http://shinken"+path, strings.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
