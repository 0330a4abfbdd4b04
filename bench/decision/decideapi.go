package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
)

// POST /v1/decide through the agent's Unix socket, as an enforcer asks it:
// the real shinken-agent daemon (its audit log, the API's caller checks,
// metrics; its own state directory, cgroup parent and pin path, removed
// after), and this process as the client, as an enforcer is: one keep-alive
// HTTP connection, one request at a time. Sessions each hold one egress
// grant; requests cycle an allowed and a denied egress and a hard-denied
// write. Every answer is checked. Printed: p50/p90/p99/p99.9 and the load
// average, then decide_api_p99_us (goal < 200). A second, smaller phase opens
// one connection per request (a client that does not keep connections), for
// reference.
var (
	decideN        = flag.Int("decide-n", 100000, "timed decisions through the API socket, keep-alive (0: skip the phase)")
	decideWarm     = flag.Int("decide-warmup", 5000, "untimed decisions first (connection, caches, the daemon's heap)")
	decideConnN    = flag.Int("decide-conn-n", 5000, "timed decisions with a new connection each (reference; 0: skip)")
	decideClient   = flag.String("decide-client", "both", "the keep-alive client of the timed phase: http (net/http's Client), raw (HTTP/1.1 written and read on one net.Conn by the calling goroutine, as a lean enforcer would), or both (interleaved in blocks; decide_api_p99_us is the raw client's)")
	decideSessions = flag.Int("decide-sessions", 100, "sessions, one egress grant each, for the API decisions")
	agentBin       = flag.String("agent-bin", "../../bin/shinken-agent", "the shinken-agent binary (make bench-decision builds it)")
	clientGCFloor  = flag.Int("decide-client-gc-floor", 64, "MiB: the benchmark client raises its own GOGC for the timed phase so its heap goal is at least this (its collections are not the agent's latency; 0: leave GOGC alone)")
	agentLog       = flag.String("decide-agent-log", "", "diagnostic: write the daemon's log here (run with GODEBUG=gctrace=1 to see its GC cycles)")
)

var decideP99 float64

func decideAPIBench() {
	if *decideN <= 0 {
		return
	}
	tmp, err := os.MkdirTemp("", "shinken-decide-bench")
	check(err)
	tag := fmt.Sprintf("shinken-bench-decide-%d", os.Getpid())
	parent, pin := tag, filepath.Join("/sys/fs/bpf", tag)
	sock := filepath.Join(tmp, "agent.sock")
	check(os.MkdirAll(filepath.Join(tmp, "manifests"), 0o755))
	check(os.WriteFile(filepath.Join(tmp, "manifests", "bench.manifest"),
		[]byte("image py\nallow net.egress cidrs=10.0.0.0/8 ports=443 tier=auto\nallow fs.scope read=/work write=/work\n"), 0o644))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	metricsAddr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(*agentBin, "-config", "", "-state-dir", filepath.Join(tmp, "state"), "-socket", sock,
		"-metrics-addr", metricsAddr, "-policy-dir", filepath.Join(tmp, "policy"), "-manifest-dir", filepath.Join(tmp, "manifests"),
		"-cgroup-parent", parent, "-pin-path", pin, "-dns-listen", "0.0.0.0:0", "-dns-upstreams", "127.0.0.1:9")
	var alog bytes.Buffer
	cmd.Stdout, cmd.Stderr = &alog, &alog
	check(cmd.Start())
	cleanup := func() {
		cmd.Process.Kill()
		cmd.Wait()
		if *agentLog != "" {
			os.WriteFile(*agentLog, alog.Bytes(), 0o644)
		}
		if out, err := exec.Command(*agentBin, "-config", "", "-cgroup-parent", parent, "-pin-path", pin, "-uninstall").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "uninstall: %v: %s\n", err, out)
		}
		os.RemoveAll(tmp)
	}
	defer cleanup()
	chk := func(err error) {
		if err != nil {
			cleanup()
			fail("decide api: %v\nagent log:\n%s", err, alog.String())
		}
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DialContext: dial}}
	post := func(c *http.Client, path string, v any) (int, []byte, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return 0, nil, err
		}
		resp, err := c.Post("http://shinken"+path, "application/json", bytes.NewReader(b))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		msg, err := io.ReadAll(resp.Body)
		return resp.StatusCode, msg, err
	}
	up := false
	for deadline := time.Now().Add(60 * time.Second); !up && time.Now().Before(deadline); {
		if resp, err := hc.Get("http://shinken/v1/status"); err == nil {
			resp.Body.Close()
			up = resp.StatusCode == 200
		}
		if !up {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !up {
		chk(fmt.Errorf("the agent did not start"))
	}
	for i := 0; i < *decideSessions; i++ {
		id := fmt.Sprintf("d%04d", i)
		code, msg, err := post(hc, "/v1/sessions", agent.SessionSpec{ID: id, Image: "py", Home: "/home/" + id})
		chk(err)
		if code != http.StatusCreated {
			chk(fmt.Errorf("create %s: HTTP %d: %s", id, code, msg))
		}
		code, msg, err = post(hc, "/v1/requests", api.RequestBody{Requests: []agent.GrantRequest{{Session: id, Lifecycle: agent.LifecycleSession,
			Capability: agent.Capability{Class: agent.ClassNetEgress, Egress: &agent.EgressScope{
				CIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)}, Ports: []agent.PortRange{{Lo: 443, Hi: 443}}}}}}})
		chk(err)
		if code != http.StatusCreated {
			chk(fmt.Errorf("grant %s: HTTP %d: %s", id, code, msg))
		}
	}
	type q struct {
		body []byte // the JSON body
		raw  []byte // the whole HTTP/1.1 request, for the lean client
		want bool
	}
	qs := make([]q, 0, 3**decideSessions)
	for i := 0; i < 3**decideSessions; i++ {
		s := i % *decideSessions
		id := fmt.Sprintf("d%04d", s)
		var r agent.UseRequest
		want := false
		switch i % 3 {
		case 0:
			r, want = agent.UseRequest{Class: agent.ClassNetEgress, Op: "connect", IP: netip.AddrFrom4([4]byte{10, byte(s >> 8), byte(s), 7}), Port: 443}, true
		case 1:
			r = agent.UseRequest{Class: agent.ClassNetEgress, Op: "connect", IP: netip.AddrFrom4([4]byte{10, byte(s >> 8), byte(s), 7}), Port: 80}
		case 2:
			r = agent.UseRequest{Class: agent.ClassFSScope, Op: "write", Path: "/home/" + id + "/.ssh/authorized_keys"}
		}
		b, _ := json.Marshal(api.DecideBody{Session: id, Request: r})
		raw := fmt.Appendf(nil, "POST /v1/decide HTTP/1.1\r\nHost: shinken\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		qs = append(qs, q{b, raw, want})
	}
	// An exchange is timed from the request's first byte written to the
	// answer's last byte read; the answer is then decoded and checked,
	// untimed (the client's JSON decoding is not the agent's latency).
	type reply struct {
		code int
		body *bytes.Buffer
	}
	readReply := func(resp *http.Response, rb *bytes.Buffer) (reply, error) {
		rb.Reset()
		_, err := rb.ReadFrom(resp.Body)
		resp.Body.Close()
		return reply{resp.StatusCode, rb}, err
	}
	// check decodes and checks one answer (both clients).
	check := func(x q, r reply) error {
		if r.code != http.StatusOK {
			return fmt.Errorf("HTTP %d: %s", r.code, r.body)
		}
		var d agent.UseDecision
		if err := json.Unmarshal(r.body.Bytes(), &d); err != nil {
			return err
		}
		if d.Allowed != x.want {
			return fmt.Errorf("%s: allowed=%v want %v (%s)", x.body, d.Allowed, x.want, d.DecidedBy)
		}
		return nil
	}
	viaClient := func(c *http.Client) func(q) (reply, error) {
		var rb bytes.Buffer
		return func(x q) (reply, error) {
			resp, err := c.Post("http://shinken/v1/decide", "application/json", bytes.NewReader(x.body))
			if err != nil {
				return reply{}, err
			}
			return readReply(resp, &rb)
		}
	}
	// The raw client: the request's bytes (made before the timed phase, as
	// an enforcer's fixed request head is) written on one connection and the
	// response read back by the same goroutine (no transport goroutines,
	// no connection pool between the caller and the socket).
	rc, err := net.Dial("unix", sock)
	chk(err)
	defer rc.Close()
	br := bufio.NewReader(rc)
	var rawBuf bytes.Buffer
	raw := func(x q) (reply, error) {
		if _, err := rc.Write(x.raw); err != nil {
			return reply{}, err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return reply{}, err
		}
		return readReply(resp, &rawBuf)
	}
	// timedRun sends n requests one at a time, timing each exchange when
	// timed, and checks every answer.
	timedRun := func(send func(q) (reply, error), n int, timed bool) []time.Duration {
		lat := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			x := qs[i%len(qs)]
			start := time.Now()
			r, err := send(x)
			if timed {
				lat = append(lat, time.Since(start))
			}
			chk(err)
			chk(check(x, r))
		}
		return lat
	}
	run := func(c *http.Client, n int, timed bool) []time.Duration { return timedRun(viaClient(c), n, timed) }
	runRaw := func(n int, timed bool) []time.Duration { return timedRun(raw, n, timed) }
	run(hc, *decideWarm, false)
	runRaw(*decideWarm, false)
	if *clientGCFloor > 0 {
		defer debug.SetGCPercent(debug.SetGCPercent(gcPercentFor(uint64(*clientGCFloor) << 20)))
	}
	load0 := loadAvg()
	var lat, httpLat []time.Duration
	const block = 1000
	for done := 0; done < *decideN; done += block {
		n := min(block, *decideN-done)
		switch *decideClient {
		case "http":
			httpLat = append(httpLat, run(hc, n, true)...)
		case "raw":
			lat = append(lat, runRaw(n, true)...)
		default:
			lat = append(lat, runRaw(n, true)...)
			httpLat = append(httpLat, run(hc, n, true)...)
		}
	}
	load1 := loadAvg()
	if len(httpLat) > 0 {
		st := summarize(slices.Clone(httpLat))
		fmt.Printf("decide API through net/http's Client (keep-alive; its transport's goroutines add hand-offs on the client side), n=%d: p50=%.1fµs p90=%.1fµs p99=%.1fµs p99.9=%.1fµs\n",
			len(httpLat), st.p50, st.p90, st.p99, st.p999)
		if len(lat) == 0 {
			lat = httpLat
		}
	}
	// The p99 of each fifth of the run, in order: how stable the figure is
	// (other work on the host shows up in one fifth, not in all).
	var parts []string
	if k := len(lat) / 5; k >= 1000 {
		for i := 0; i < 5; i++ {
			parts = append(parts, fmt.Sprintf("%.0f", summarize(slices.Clone(lat[i*k:(i+1)*k])).p99))
		}
	}
	st := summarize(lat)
	fmt.Printf("decide API (the shinken-agent daemon, POST /v1/decide on its Unix socket, one keep-alive connection, client %s, %d sessions × 1 grant, 1/3 allowed, n=%d after %d untimed; load average %s before, %s after): p50=%.1fµs p90=%.1fµs p99=%.1fµs p99.9=%.1fµs max=%.1fµs\n",
		*decideClient, *decideSessions, len(lat), *decideWarm, load0, load1, st.p50, st.p90, st.p99, st.p999, float64(lat[len(lat)-1])/1e3)
	if parts != nil {
		fmt.Printf("decide API p99 of each fifth of the run, in order (µs): %s\n", strings.Join(parts, " "))
	}
	decideP99 = st.p99
	if *decideConnN > 0 {
		// A fresh connection per request: the dial, the server's accept and
		// peer-credential lookup, then the same request.
		nc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
		load0 := loadAvg()
		cl := run(nc, *decideConnN, true)
		st := summarize(cl)
		fmt.Printf("decide API, a new connection per request (reference), n=%d, load average %s before, %s after: p50=%.1fµs p90=%.1fµs p99=%.1fµs\n",
			len(cl), load0, loadAvg(), st.p50, st.p90, st.p99)
	}
}

// gcPercentFor is the GOGC that puts this process's heap goal at floor
// bytes (live × (1 + GOGC/100)), at least 100.
func gcPercentFor(floor uint64) int {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	live := s[0].Value.Uint64()
	if live == 0 || live*2 >= floor {
		return 100
	}
	return int(min(floor*100/live-100, 10000))
}

// loadAvg is the host's 1-, 5- and 15-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
