package main

// End-to-end: the session runtime (issue 20) through the real daemon and
// shinkenctl: exec with exit codes, signals and stdin, a run that outlives
// its request, kill -9 of the agent while a process prints, pause and
// resume, and the attach stream (replay from an offset, several clients,
// the Origin check).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/audit"
)

func (e *env) ctlCode(stdin string, args ...string) (string, int) {
	cmd := exec.Command(filepath.Join(e.bin, "shinkenctl"), append([]string{"-socket", e.socket}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		e.t.Fatal(err)
	}
	return string(out), 0
}

func (e *env) procs(session string) map[string]wire.Process {
	var ps []wire.Process
	e.ctlJSON(&ps, "ps", session)
	m := map[string]wire.Process{}
	for _, p := range ps {
		m[p.ID] = p
	}
	return m
}

func (e *env) waitExit(session, id string) wire.Process {
	e.t.Helper()
	for i := 0; i < 300; i++ {
		if p := e.procs(session)[id]; p.State != wire.ProcRunning {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("process %s did not end", id)
	return wire.Process{}
}

func cpuUsage(t *testing.T, cgroup string) int64 {
	b, err := os.ReadFile(filepath.Join(cgroup, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no usage_usec in %s", b)
	return 0
}

// grows waits (up to 10 s: the machine may be busy) for the cgroup's CPU
// usage to pass from+by µs; it returns the last reading.
func grows(t *testing.T, cgroup string, from, by int64) int64 {
	u := cpuUsage(t, cgroup)
	for i := 0; i < 200 && u-from < by; i++ {
		time.Sleep(50 * time.Millisecond)
		u = cpuUsage(t, cgroup)
	}
	return u
}

func TestProcessesEndToEnd(t *testing.T) {
	e := newEnv(t)
	e.extra = []string{"-request-timeout", "2s"}
	e.startAgent()
	e.mustCtl("session", "create", "p1", "-image", "e2e")

	t.Run("exit codes, signals and stdin pass through exec", func(t *testing.T) {
		out, code := e.ctlCode("", "exec", "p1", "--", "sh", "-c", "echo out; echo err >&2; exit 5")
		if code != 5 || !strings.Contains(out, "out\n") || !strings.Contains(out, "err\n") {
			t.Errorf("exit 5: code %d, %q", code, out)
		}
		if out, code := e.ctlCode("", "exec", "p1", "--", "sh", "-c", "kill -TERM $$"); code != 128+int(syscall.SIGTERM) {
			t.Errorf("SIGTERM: code %d, %q", code, out)
		}
		if out, code := e.ctlCode("abc\ndef\n", "exec", "-i", "p1", "--", "cat"); code != 0 || out != "abc\ndef\n" {
			t.Errorf("stdin: code %d, %q", code, out)
		}
		// Refused before anything starts: clear errors, nothing listed.
		for _, args := range [][]string{{"exec", "p1", "--", "no-such-program"}, {"exec", "-w", "relative", "p1", "--", "true"},
			{"exec", "-uid", "1", "p1", "--", "true"}, {"exec", "nosession", "--", "true"}} {
			if out, code := e.ctlCode("", args...); code != 1 || !strings.Contains(out, "HTTP 4") {
				t.Errorf("%v: code %d, %q", args, code, out)
			}
		}
		for _, p := range e.procs("p1") {
			if p.Argv[0] == "no-such-program" || p.Argv[0] == "true" {
				t.Errorf("a refused start is listed: %+v", p)
			}
		}
	})

	t.Run("exec -it: a shell with our terminal's size, resize, ^C, exit code", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(e.bin, "shinkenctl"), "-socket", e.socket, "exec", "-it", "p1", "--", "bash", "--norc", "--noprofile", "-i")
		ptm, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
		if err != nil {
			t.Fatal(err)
		}
		defer ptm.Close()
		var mu sync.Mutex
		var out strings.Builder
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := ptm.Read(buf)
				mu.Lock()
				out.Write(buf[:n])
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
		expect := func(want string) {
			t.Helper()
			for i := 0; i < 200; i++ {
				mu.Lock()
				ok := strings.Contains(out.String(), want)
				mu.Unlock()
				if ok {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("no %q in %q", want, out.String())
		}
		ptm.Write([]byte("stty size\r"))
		expect("24 80")
		pty.Setsize(ptm, &pty.Winsize{Rows: 40, Cols: 120}) // SIGWINCH to shinkenctl
		time.Sleep(300 * time.Millisecond)
		ptm.Write([]byte("stty size\r"))
		expect("40 120")
		ptm.Write([]byte("sleep 100\r"))
		time.Sleep(500 * time.Millisecond)
		ptm.Write([]byte{3})
		ptm.Write([]byte("echo st=$?\r"))
		expect("st=130")
		ptm.Write([]byte("exit 3\r"))
		err = cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Errorf("shinkenctl exec -it: %v", err)
		}
	})

	t.Run("a process outlives its request's deadline", func(t *testing.T) {
		var res wire.RunResult
		t0 := time.Now()
		e.ctlJSON(&res, "run", "p1", "-timeout", "30", "--", "sh", "-c", "sleep 4; echo done")
		if took := time.Since(t0); !res.Running || res.Process == "" || took > 3500*time.Millisecond {
			t.Fatalf("run answered %+v after %v", res, took)
		}
		p := e.waitExit("p1", res.Process)
		if p.ExitCode == nil || *p.ExitCode != 0 || p.Reason != "exit" {
			t.Errorf("after the request: %+v", p)
		}
		if out := e.mustCtl("logs", "p1", res.Process); out != "done\n" {
			t.Errorf("logs: %q", out)
		}
	})

	t.Run("kill -9 of the agent while a process prints", func(t *testing.T) {
		id := strings.TrimSpace(e.mustCtl("start", "p1", "--", "sh", "-c", "i=0; while [ $i -lt 40 ]; do echo tick-$i; i=$((i+1)); sleep 0.1; done"))
		time.Sleep(600 * time.Millisecond)
		before := e.procs("p1")[id]
		e.stopAgent(syscall.SIGKILL)
		time.Sleep(1500 * time.Millisecond) // it prints on, unwatched
		e.startAgent()
		after, ok := e.procs("p1")[id]
		if !ok || after.PID != before.PID || before.PID == 0 {
			t.Fatalf("after restart: %+v (before %+v)", after, before)
		}
		e.waitExit("p1", id)
		var want strings.Builder
		for i := 0; i < 40; i++ {
			fmt.Fprintf(&want, "tick-%d\n", i)
		}
		if out := e.mustCtl("logs", "-f", "p1", id); out != want.String() {
			t.Errorf("output across the restart:\n%q\nwant\n%q", out, want.String())
		}
	})

	t.Run("pause stops a CPU loop and resume continues it", func(t *testing.T) {
		id := strings.TrimSpace(e.mustCtl("start", "p1", "--", "sh", "-c", "while :; do :; done"))
		cg := filepath.Join(e.cgroupDir, "p1")
		time.Sleep(300 * time.Millisecond)
		e.mustCtl("pause", "p1")
		var v wire.SessionView
		e.ctlJSON(&v, "session", "show", "p1")
		if !v.Paused || v.PausedSince == nil {
			t.Errorf("session view while paused: paused %v since %v", v.Paused, v.PausedSince)
		}
		listedPaused := func() bool {
			var vs []wire.SessionView
			e.ctlJSON(&vs, "session", "ls")
			for _, s := range vs {
				if s.ID == "p1" {
					return s.Paused
				}
			}
			t.Fatal("p1 not listed")
			return false
		}
		if !listedPaused() {
			t.Error("session ls does not list p1 as paused")
		}
		if ls := e.mustCtl("session", "ls"); !strings.Contains(ls, "PAUSED") || !regexp.MustCompile(`(?m)^p1 .* paused +/`).MatchString(ls) {
			t.Errorf("session ls's table does not show p1 paused:\n%s", ls)
		}
		u1 := cpuUsage(t, cg)
		time.Sleep(time.Second)
		u2 := cpuUsage(t, cg)
		// A new agent learns the pause of the one before it (the listing
		// reads no cgroup.events per session: agent.PausedKnown).
		e.stopAgent(syscall.SIGKILL)
		e.startAgent()
		if !listedPaused() {
			t.Error("after a restart, session ls does not list p1 as paused")
		}
		e.mustCtl("resume", "p1")
		if listedPaused() {
			t.Error("session ls lists p1 as paused after resume")
		}
		u3 := grows(t, cg, u2, 100000)
		t.Logf("usage_usec: paused %d → %d over 1 s, resumed → %d", u1, u2, u3)
		// Frozen: no task runs, but per-CPU usage not yet folded into
		// cpu.stat when it was first read may still show (a few µs); a
		// running loop adds about 1,000,000 µs per second.
		if u2-u1 > 5000 || u3-u2 < 100000 {
			t.Errorf("usage_usec: paused %d → %d, resumed → %d", u1, u2, u3)
		}
		var v2 wire.SessionView
		e.ctlJSON(&v2, "session", "show", "p1")
		if v2.Paused {
			t.Error("still paused after resume")
		}
		e.mustCtl("kill", "p1", id)
		if p := e.waitExit("p1", id); p.Reason != "killed" {
			t.Errorf("kill: %+v", p)
		}
	})

	t.Run("attach: replay from an offset, two clients, Origin", func(t *testing.T) {
		id := strings.TrimSpace(e.mustCtl("start", "p1", "--", "sh", "-c", "i=0; while [ $i -lt 30 ]; do echo line-$i; i=$((i+1)); sleep 0.05; done"))
		hc := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", e.socket) }}}
		url := fmt.Sprintf("ws://shinken/v1/sessions/p1/processes/%s/attach", id)
		// The first client reads a little and goes away.
		first, _, off := attachRead(t, hc, url+"?from=0", 3)
		// A second one reads it all, as does a third from where the first stopped.
		done := make(chan string, 1)
		go func() { all, _, _ := attachRead(t, hc, url+"?from=0", -1); done <- all }()
		rest, info, _ := attachRead(t, hc, fmt.Sprintf("%s?from=%d", url, off), -1)
		all := <-done
		if info.Offset != off || info.Dropped != 0 || first+rest != all || !strings.HasSuffix(all, "line-29\n") {
			t.Errorf("first %q + rest %q (from %d, info %+v) != %q", first, rest, off, info, all)
		}
		req, _ := http.NewRequest("GET", "http://shinken/v1/sessions/p1/processes/"+id+"/attach", nil)
		for k, v := range map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Origin": "http://evil.example"} {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("attach from a foreign Origin: %d", resp.StatusCode)
		}
	})

	t.Run("exec: start and attach in one request; refused before anything starts", func(t *testing.T) {
		hc := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", e.socket) }}}
		start := func(argv ...string) string {
			b, _ := json.Marshal(wire.ProcessStart{Argv: argv})
			return url.Values{"start": {string(b)}}.Encode()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, "ws://shinken/v1/sessions/p1/exec?"+start("sh", "-c", "echo exec-one; exit 3"),
			&websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{wire.AttachProtocol}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		id := resp.Header.Get("X-Shinken-Process")
		var out strings.Builder
		st, _ := readStream(t, ctx, c, nil, func(b []byte) bool { out.Write(b); return true })
		if out.String() != "exec-one\n" || st.ExitCode == nil || *st.ExitCode != 3 {
			t.Errorf("exec: %q, %+v", out.String(), st)
		}
		if p, ok := e.procs("p1")[id]; !ok || p.Argv[0] != "sh" {
			t.Errorf("exec's process %q not listed as its own: %+v", id, p)
		}
		// Not an upgrade, a bad start, an unknown session: 4xx, nothing starts.
		before := len(e.procs("p1"))
		for _, u := range []string{"/v1/sessions/p1/exec?" + start("true"), "/v1/sessions/p1/exec?start=%7B%22argv%22%3A1%7D",
			"/v1/sessions/p1/exec?start=%7B%22argv%22%3A%5B%22true%22%5D%2C%22nope%22%3A1%7D", "/v1/sessions/nosession/exec?" + start("true")} {
			resp, err := hc.Get("http://shinken" + u)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 4 {
				t.Errorf("GET %s: HTTP %d", u, resp.StatusCode)
			}
		}
		req, _ := http.NewRequest("GET", "http://shinken/v1/sessions/p1/exec?"+start("true"), nil)
		for k, v := range map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
			"Sec-WebSocket-Protocol": wire.AttachProtocol, "Origin": "http://evil.example"} {
			req.Header.Set(k, v)
		}
		if resp, err := hc.Do(req); err != nil {
			t.Fatal(err)
		} else if resp.Body.Close(); resp.StatusCode != http.StatusForbidden {
			t.Errorf("exec from a foreign Origin: %d", resp.StatusCode)
		}
		_, resp, err = websocket.Dial(ctx, "ws://shinken/v1/sessions/p1/exec?"+start("no-such-program"),
			&websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{wire.AttachProtocol}})
		if err == nil || resp == nil || resp.StatusCode/100 != 4 {
			t.Errorf("exec of a missing program: %v, %+v", err, resp)
		}
		if n := len(e.procs("p1")); n != before {
			t.Errorf("refused execs listed: %d processes, %d before", n, before)
		}
	})

	// The ring keeps 1 MiB (the default); the process writes 8 MiB as fast
	// as it can to a client that reads a message every 10 ms: the hold
	// must keep it from lapping what the client has not yet read (the
	// agent's messages are up to 1 MiB, read from the ring before they are
	// sent), so the client gets every byte and no drop.
	t.Run("attach: a slow client loses nothing of a fast writer", func(t *testing.T) {
		hc := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", e.socket) }}}
		const n = 1100000 // seq 1 n: 8.0 MB
		b, _ := json.Marshal(wire.ProcessStart{Argv: []string{"sh", "-c", fmt.Sprintf("read _ && exec seq 1 %d", n)}, Interactive: true})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws://shinken/v1/sessions/p1/exec?"+url.Values{"start": {string(b)}}.Encode(),
			&websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{wire.AttachProtocol}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		if err := c.Write(ctx, websocket.MessageBinary, []byte{wire.ChanStdin, '\n'}); err != nil {
			t.Fatal(err)
		}
		want, err := exec.Command("seq", "1", fmt.Sprint(n)).Output()
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		msgs := 0
		st, _ := readStream(t, ctx, c, func(i wire.AttachInfo) {
			if i.Dropped != 0 {
				t.Errorf("the ring dropped bytes an attached client had not read: %+v", i)
			}
		}, func(b []byte) bool {
			out.Write(b)
			msgs++
			time.Sleep(10 * time.Millisecond)
			return true
		})
		if !bytes.Equal(out.Bytes(), want) || st.Status != "Success" {
			t.Errorf("a slow client got %d bytes of %d (equal: %v) in %d messages, status %+v", out.Len(), len(want), bytes.Equal(out.Bytes(), want), msgs, st)
		}
		t.Logf("%d bytes in %d messages", out.Len(), msgs)
	})

	if len(e.procDirs()) == 0 {
		t.Fatal("no process directories before the session ends")
	}
	e.mustCtl("session", "rm", "p1")
	for i := 0; i < 100 && len(e.procDirs()) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if d := e.procDirs(); len(d) > 0 {
		t.Errorf("process records left after the session ended: %v", d)
	}
}

// The session's end takes its processes' records with it.
func (e *env) procDirs() []string {
	m, _ := filepath.Glob(filepath.Join(e.dir, "state", "procs", "p-*"))
	return m
}

// TestPauseOnAsk: a session whose manifest says pause-on-ask is frozen
// while its card is pending and thawed when the card is decided; the audit
// log records both, with the time paused.
func TestPauseOnAsk(t *testing.T) {
	e := newEnv(t)
	if err := os.WriteFile(filepath.Join(e.dir, "manifests", "ask.manifest"), []byte("image ask\nallow net.egress cidrs=127.0.0.3/32 tier=ask\npause-on-ask\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.startAgent()
	e.mustCtl("session", "create", "pa", "-image", "ask")
	id := strings.TrimSpace(e.mustCtl("start", "pa", "--", "sh", "-c", "while :; do :; done"))
	cg := filepath.Join(e.cgroupDir, "pa")
	paused := func() bool {
		var v wire.SessionView
		e.ctlJSON(&v, "session", "show", "pa")
		return v.Paused
	}
	var res []reqResult
	e.ctlJSON(&res, "request", "pa", "net.egress", "-cidr", "127.0.0.3/32", "-port", "80")
	if res[0].Outcome != "pending" {
		t.Fatalf("%+v", res)
	}
	for i := 0; i < 100 && !paused(); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	u1 := cpuUsage(t, cg)
	time.Sleep(500 * time.Millisecond)
	if u2 := cpuUsage(t, cg); !paused() || u2-u1 > 5000 {
		t.Fatalf("card pending: paused %v, usage %d → %d", paused(), u1, u2)
	}
	e.mustCtl("deny", res[0].Card)
	for i := 0; i < 100 && paused(); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	u3 := cpuUsage(t, cg)
	if u4 := grows(t, cg, u3, 50000); paused() || u4-u3 < 50000 {
		t.Fatalf("card denied: paused %v, usage %d → %d", paused(), u3, u4)
	}
	e.mustCtl("kill", "pa", id)
	b, err := os.ReadFile(filepath.Join(e.dir, "state", audit.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "session.pause") || !strings.Contains(string(b), "resumed after") {
		t.Errorf("audit log lacks the pause and its length:\n%s", grepLines(string(b), "session."))
	}
}

// attachRead attaches and reads stdout: n messages (then disconnects), or
// to the end (n < 0). It returns the bytes, the first AttachInfo and the
// offset after the bytes.
func attachRead(t *testing.T, hc *http.Client, url string, n int) (string, wire.AttachInfo, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	var out strings.Builder
	var info wire.AttachInfo
	var off uint64
	got := 0
	if n == 0 {
		return "", info, 0
	}
	readStream(t, ctx, c, func(i wire.AttachInfo) {
		if i.Stream == "stdout" && info.Stream == "" {
			info, off = i, i.Offset
		}
	}, func(b []byte) bool {
		out.Write(b)
		off += uint64(len(b))
		got++
		return n < 0 || got < n
	})
	return out.String(), info, off
}

// readStream reads an attach stream's messages, handing each AttachInfo to
// info (nil: none wanted) and each stdout payload to stdout, until the exit
// status comes (returned, true) or stdout says it wants no more (false).
func readStream(t *testing.T, ctx context.Context, c *websocket.Conn, info func(wire.AttachInfo), stdout func([]byte) bool) (wire.AttachStatus, bool) {
	t.Helper()
	for {
		_, m, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("attach read: %v", err)
		}
		switch m[0] {
		case wire.ChanInfo:
			var i wire.AttachInfo
			json.Unmarshal(m[1:], &i)
			if info != nil {
				info(i)
			}
		case wire.ChanStdout:
			if !stdout(m[1:]) {
				return wire.AttachStatus{}, false
			}
		case wire.ChanStatus:
			var st wire.AttachStatus
			json.Unmarshal(m[1:], &st)
			return st, true
		}
	}
}
