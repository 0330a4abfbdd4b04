package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

// frontOn serves h through a Front on a fresh Unix socket; it returns the
// socket's path and the front (shut down at the test's end).
func frontOn(t *testing.T, h http.Handler, hs *http.Server) (string, *Front) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if hs == nil {
		hs = &http.Server{ReadHeaderTimeout: 10 * time.Second}
	}
	f := NewFront(h, ln, hs, nil)
	done := make(chan error, 1)
	go func() { done <- f.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v, want ErrServerClosed", err)
		}
	})
	return sock, f
}

// pathHandler answers every request with "PATH lean|nethttp BODY": which of
// the front's two paths served it, and the body it read.
var pathHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	via := "nethttp"
	if _, ok := w.(*leanWriter); ok {
		via = "lean"
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s %s %s", r.URL.Path, via, body)
})

// rawConn is a test client that writes bytes and reads HTTP answers.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, sock string) *rawConn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatal(err)
	}
}

// answer reads one answer: its code, body and whether it says it closes.
func (r *rawConn) answer() (int, string, bool) {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		r.t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Close
}

// closed reports whether the server closed the connection (EOF within 5 s).
func (r *rawConn) closed() bool {
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := r.br.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "reset by peer") }

func decideReq(body string, extra ...string) string {
	h := "POST /v1/decide HTTP/1.1\r\nHost: shinken\r\nContent-Type: application/json\r\n"
	for _, e := range extra {
		h += e + "\r\n"
	}
	return fmt.Sprintf("%sContent-Length: %d\r\n\r\n%s", h, len(body), body)
}

// TestFrontPaths: on one keep-alive connection, POST /v1/decide is served by
// the lean loop; the first other request moves the connection to net/http's
// server, which then answers everything on it (decide included), with the
// bytes the lean loop had read ahead (a pipelined request) intact.
func TestFrontPaths(t *testing.T) {
	sock, _ := frontOn(t, pathHandler, nil)
	rc := dialRaw(t, sock)
	for i := 0; i < 3; i++ {
		rc.send(decideReq(fmt.Sprintf(`{"n":%d}`, i)))
		code, body, closing := rc.answer()
		if want := fmt.Sprintf(`/v1/decide lean {"n":%d}`, i); code != 200 || body != want || closing {
			t.Fatalf("decide %d: %d %q close=%v, want 200 %q", i, code, body, closing, want)
		}
	}
	// Two requests in one write: a status read, then a decide; the second
	// was read ahead by the loop's buffer before the hand-off.
	rc.send("GET /v1/status HTTP/1.1\r\nHost: shinken\r\n\r\n" + decideReq(`{"n":"after"}`))
	if code, body, _ := rc.answer(); code != 200 || body != "/v1/status nethttp " {
		t.Fatalf("status: %d %q, want net/http's answer", code, body)
	}
	if code, body, _ := rc.answer(); code != 200 || body != `/v1/decide nethttp {"n":"after"}` {
		t.Fatalf("decide after the hand-off: %d %q", code, body)
	}
	// Pipelined decides on the lean loop: answered in order.
	rc2 := dialRaw(t, sock)
	rc2.send(decideReq(`{"n":"a"}`) + decideReq(`{"n":"b"}`))
	for _, n := range []string{"a", "b"} {
		if code, body, _ := rc2.answer(); code != 200 || body != fmt.Sprintf(`/v1/decide lean {"n":%q}`, n) {
			t.Fatalf("pipelined %s: %d %q", n, code, body)
		}
	}
	// net/http's Client (what shinkenctl uses) on the lean loop.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	for i := 0; i < 2; i++ {
		resp, err := hc.Post("http://shinken/v1/decide", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "/v1/decide lean {}" || resp.Header.Get("Content-Type") != "text/plain" || resp.Header.Get("Date") == "" {
			t.Fatalf("net/http client: %d %q %v", resp.StatusCode, b, resp.Header)
		}
	}
}

// TestFrontProtocol: the lean loop's HTTP/1.1 edges behave as net/http's
// server does: a chunked body, Expect: 100-continue, HTTP/1.0 and
// Connection: close (answered, then closed), a missing Host header and a
// malformed request (400, closed), an oversized header (431), a body over
// the handler's limit (its 400, then closed: the rest is not read), a
// header that arrives in pieces, and one that stalls (closed after
// ReadHeaderTimeout).
func TestFrontProtocol(t *testing.T) {
	sock, _ := frontOn(t, pathHandler, &http.Server{ReadHeaderTimeout: 300 * time.Millisecond})

	rc := dialRaw(t, sock)
	rc.send("POST /v1/decide HTTP/1.1\r\nHost: shinken\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
	if code, body, closing := rc.answer(); code != 200 || body != "/v1/decide lean abcde" || closing {
		t.Errorf("chunked: %d %q close=%v", code, body, closing)
	}
	rc.send("POST /v1/decide HTTP/1.1\r\nHost: shinken\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
	if code, _, _ := rc.answer(); code != http.StatusContinue {
		t.Fatalf("Expect: 100-continue: first answer %d, want 100", code)
	}
	rc.send("{}")
	if code, body, _ := rc.answer(); code != 200 || body != "/v1/decide lean {}" {
		t.Errorf("after 100-continue: %d %q", code, body)
	}

	for name, req := range map[string]string{
		"HTTP/1.0":          "POST /v1/decide HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
		"Connection: close": decideReq("{}", "Connection: close"),
	} {
		rc := dialRaw(t, sock)
		rc.send(req)
		if code, body, closing := rc.answer(); code != 200 || body != "/v1/decide lean {}" || !closing {
			t.Errorf("%s: %d %q close=%v, want 200 and Connection: close", name, code, body, closing)
		}
		if !rc.closed() {
			t.Errorf("%s: the connection stayed open", name)
		}
	}

	for name, tc := range map[string]struct {
		req  string
		want int
	}{
		"no Host":        {"POST /v1/decide HTTP/1.1\r\nContent-Length: 0\r\n\r\n", http.StatusBadRequest},
		"malformed":      {"POST /v1/decide HTTP/1.1\r\nHost: shinken\r\nContent-Length: x\r\n\r\n", http.StatusBadRequest},
		"bad Expect":     {decideReq("{}", "Expect: something"), http.StatusExpectationFailed},
		"control byte":   {"POST /v1/decide HTTP/1.1\r\nHost: shinken\r\nno colon \x01\xff here\r\n\r\n", http.StatusBadRequest},
		"header too big": {"POST /v1/decide HTTP/1.1\r\nHost: shinken\r\nX-Big: " + strings.Repeat("a", http.DefaultMaxHeaderBytes+8192) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
	} {
		rc := dialRaw(t, sock)
		go io.WriteString(rc.c, tc.req) // the server may stop reading early
		code, body, closing := rc.answer()
		if code != tc.want || !closing {
			t.Errorf("%s: %d close=%v, want %d and Connection: close", name, code, closing, tc.want)
		}
		var e Error
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" || e.Code != http.StatusText(tc.want) {
			t.Errorf("%s: the error body %q is not the API's error JSON: %v", name, body, err)
		}
		if !rc.closed() {
			t.Errorf("%s: the connection stayed open", name)
		}
	}

	// A body over the handler's 1 MiB limit: its error, and the connection
	// closed rather than the rest of the body read and discarded.
	big := dialRaw(t, sock)
	go io.WriteString(big.c, decideReq(strings.Repeat("x", 2<<20)))
	if code, body, closing := big.answer(); code != http.StatusBadRequest || !strings.Contains(body, "too large") || !closing {
		t.Errorf("oversized body: %d %q close=%v", code, body, closing)
	}

	// A header that arrives in pieces is waited for; one that stalls is
	// cut at ReadHeaderTimeout.
	slow := dialRaw(t, sock)
	slow.send("POST /v1/dec")
	time.Sleep(100 * time.Millisecond)
	slow.send("ide HTTP/1.1\r\nHost: shin")
	time.Sleep(100 * time.Millisecond)
	slow.send("ken\r\nContent-Length: 2\r\n\r\n{}")
	if code, body, _ := slow.answer(); code != 200 || body != "/v1/decide lean {}" {
		t.Errorf("header in pieces: %d %q", code, body)
	}
	stall := dialRaw(t, sock)
	stall.send("POST /v1/decide HTTP/1.1\r\nHost: shinken\r\n")
	start := time.Now()
	if !stall.closed() {
		t.Errorf("a stalled header kept the connection open")
	} else if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a stalled header was cut after %v, want about 300ms", d)
	}
	// An idle keep-alive connection is not cut (no idle timeout, as
	// net/http's server with IdleTimeout and ReadTimeout unset).
	idle := dialRaw(t, sock)
	idle.send(decideReq("{}"))
	idle.answer()
	time.Sleep(500 * time.Millisecond)
	idle.send(decideReq("{}"))
	if code, _, _ := idle.answer(); code != 200 {
		t.Errorf("after an idle pause: %d", code)
	}
}

// TestFrontAuth: the caller check guards the lean loop as it guards
// net/http's path, and a connection handed off keeps its verdict: a caller
// inside the sessions' cgroup (this test's own cgroup) is refused on a
// decide and on a request after the hand-off; one outside is admitted.
func TestFrontAuth(t *testing.T) {
	own := ownCgroup(t)
	for _, tc := range []struct {
		cgroup string
		decide int // a zero Agent: an admitted decide of an unknown session panics into a 500
		other  int
	}{{own, http.StatusForbidden, http.StatusForbidden}, {"/shinken-no-such-cgroup", http.StatusInternalServerError, http.StatusNotFound}} {
		srv, err := NewServer(Config{Agent: new(agent.Agent), Backend: backend.Unsupported{}, Hub: NewHub(4), Auth: Authorizer{OperatorGID: callerGroup(), SessionsCgroup: tc.cgroup}})
		if err != nil {
			t.Fatal(err)
		}
		sock, _ := frontOn(t, srv, nil)
		rc := dialRaw(t, sock)
		rc.send(decideReq(`{"session":"s","request":{"class":"net.egress","op":"connect"}}`))
		code, body, _ := rc.answer()
		if code != tc.decide {
			t.Errorf("sessions cgroup %q: decide: %d %s, want %d", tc.cgroup, code, body, tc.decide)
		}
		if code == http.StatusInternalServerError {
			if !rc.closed() {
				t.Errorf("after a handler panic the connection stayed open")
			}
			rc = dialRaw(t, sock) // the front still serves
		}
		rc.send("GET /v1/no-such-route HTTP/1.1\r\nHost: shinken\r\n\r\n")
		if code, body, _ := rc.answer(); code != tc.other {
			t.Errorf("sessions cgroup %q: after the hand-off: %d %s, want %d", tc.cgroup, code, body, tc.other)
		}
	}
}

// TestFrontShutdown: Shutdown closes idle lean connections, lets a request
// in progress finish (its answer arrives, then the connection closes),
// closes handed-off connections through net/http's Shutdown, and Serve
// returns http.ErrServerClosed; nothing is accepted after.
func TestFrontShutdown(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("wait") != "" {
			entered <- struct{}{}
			<-release
		}
		pathHandler(w, r)
	})
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := NewFront(h, ln, &http.Server{ReadHeaderTimeout: 10 * time.Second}, nil)
	served := make(chan error, 1)
	go func() { served <- f.Serve() }()

	idle := dialRaw(t, sock)
	idle.send(decideReq("{}"))
	idle.answer()
	handed := dialRaw(t, sock)
	handed.send("GET /v1/x HTTP/1.1\r\nHost: shinken\r\n\r\n")
	handed.answer()
	busy := dialRaw(t, sock)
	busy.send(strings.Replace(decideReq("{}"), "/v1/decide ", "/v1/decide?wait=1 ", 1))
	<-entered

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- f.Shutdown(ctx)
	}()
	if !idle.closed() {
		t.Errorf("an idle lean connection stayed open")
	}
	if !handed.closed() {
		t.Errorf("a handed-off idle connection stayed open")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while a request was in progress", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if code, _, _ := busy.answer(); code != 200 {
		t.Errorf("the request in progress: %d", code)
	}
	if !busy.closed() {
		t.Errorf("the connection of the finished request stayed open")
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Errorf("a connection was accepted after Shutdown")
	}
}

// TestEventsFollow: a followed event stream (handed off to net/http by the
// front) carries each agent event as JSON, though the hub keeps it as a
// value until a reader encodes it.
func TestEventsFollow(t *testing.T) {
	hub := NewHub(8)
	srv, err := NewServer(Config{Agent: new(agent.Agent), Backend: backend.Unsupported{}, Hub: hub, Auth: Authorizer{OperatorGID: callerGroup(), SessionsCgroup: "/shinken-no-such-cgroup"}})
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := frontOn(t, srv, nil)
	rc := dialRaw(t, sock)
	rc.send("GET /v1/events?follow=1 HTTP/1.1\r\nHost: shinken\r\n\r\n")
	rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow: %v %v", resp, err)
	}
	ev := agent.Event{Time: time.Unix(1700000000, 0).UTC(), Kind: agent.EventUseDenied, Session: "s1", Class: agent.ClassNetEgress, Outcome: "denied", Rule: "default-deny"}
	want, _ := json.Marshal(ev)
	got := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(resp.Body)
		if lines.Scan() {
			got <- lines.Text()
		}
	}()
	for deadline := time.Now().Add(5 * time.Second); ; {
		hub.Publish("agent", ev.Kind, ev) // until the subscription is in place
		select {
		case line := <-got:
			var rec Record
			if err := json.Unmarshal([]byte(line), &rec); err != nil || string(rec.Data) != string(want) || rec.Kind != ev.Kind {
				t.Fatalf("followed line %s (%v), want data %s", line, err, want)
			}
			return
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no event on the followed stream")
			}
		}
	}
}
