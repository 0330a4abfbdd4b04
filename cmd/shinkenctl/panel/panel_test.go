package panel

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAgent answers the few API calls the panel makes, over a Unix socket
// like the real one, and records the POSTs it gets.
type fakeAgent struct {
	mu    sync.Mutex
	posts []string
	feed  chan string
}

func (f *fakeAgent) handler() http.Handler {
	m := http.NewServeMux()
	js := func(w http.ResponseWriter, s string) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, s)
	}
	m.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		js(w, `{"sessions":1,"enforcement":[{"class":"net.egress","grantable":true,"level":"revocable in-kernel","mechanism":"cgroup/connect4"},{"class":"gpu","grantable":false,"level":"unavailable","mechanism":"","reason":"not wired"}],
			"backend":{"os":"linux","backend":"bpf","classes":[],"facts":{"flow_mode":"sweep"}}}`)
	})
	m.HandleFunc("GET /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		js(w, `[{"id":"s1","image":"default","trust_tier":"normal","risk":"normal","headless":false,"tls_inspection":false,"index":3,"cgroup_id":7,"cgroup":"/sys/fs/cgroup/unified/shinken/s1","uid":1879048195}]`)
	})
	m.HandleFunc("GET /v1/grants", func(w http.ResponseWriter, r *http.Request) {
		js(w, `[{"id":"g-parent","session":"s1","capability":{"class":"net.egress","net_egress":{"cidrs":["10.0.0.0/8"]}},"tier":"auto","provenance":"","lifecycle":"session","phase":"live","kernel":{"slot":1,"generation":1}},
			{"id":"g-child","session":"s1","capability":{"class":"net.egress","net_egress":{"cidrs":["10.1.0.0/16"]}},"tier":"auto","provenance":"","lifecycle":"session","parent":"g-parent","phase":"live","kernel":{"slot":2,"generation":1}},
			{"id":"g-dead","session":"s1","capability":{"class":"net.egress","net_egress":{"cidrs":["10.2.0.0/16"]}},"tier":"auto","provenance":"","lifecycle":"session","phase":"revoked","kernel":{"slot":3,"generation":1}},
			{"id":"g-fs","session":"s1","capability":{"class":"fs.scope","fs_scope":{"read":["/home/u/.ssh","/work"],"write":["/work/out"],"delete":["/work/out/tmp"],"deny":["/work/.git"]}},"tier":"notify","provenance":"","lifecycle":"session","phase":"live","kernel":{"slot":4,"generation":1},"overrides":["/home/u/.ssh"]},
			{"id":"g-fs-dead","session":"s1","capability":{"class":"fs.scope","fs_scope":{"write":["/srv"]}},"tier":"ask","provenance":"","lifecycle":"session","phase":"revoked","kernel":{"slot":5,"generation":1}},
			{"id":"g-keep","session":"s1","capability":{"class":"persistence","persistence":{"paths":["/work/cache"],"survives_session":true}},"tier":"ask","provenance":"","lifecycle":"session","phase":"live","kernel":{"slot":6,"generation":1}}]`)
	})
	m.HandleFunc("GET /v1/cards", func(w http.ResponseWriter, r *http.Request) {
		js(w, `[{"id":"c-1","session":"s1","tier":"ask","created":"2026-01-01T00:00:00Z","expires":"2099-01-01T00:00:00Z","status":"pending",
			"items":[{"approval":"a1","actor":"uid:0(alice)","action":"UseCapability","resource":"net.egress","scope":{"class":"net.egress","net_egress":{"cidrs":["192.0.2.10/32"],"ports":[{"lo":443,"hi":443}]}},"provenance":"external","lifecycle":"session","rule":"tier:ask (class net.egress, provenance external)","tier":"ask"}]}]`)
	})
	m.HandleFunc("GET /v1/audit/verify", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusConflict)
		js(w, `{"ok":false,"error":"1 problem(s): seq 4: hash mismatch","result":null}`)
	})
	m.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("follow") == "" {
			io.WriteString(w, `{"time":"2026-01-01T00:00:00Z","source":"kernel","kind":"kernel.deny","data":{"session":"s1","dst":"192.0.2.1:80","reason":"no_rule","pid":1234567}}`+"\n")
			io.WriteString(w, `{"time":"2026-01-01T00:00:01Z","source":"agent","kind":"grant.issue","data":{}}`+"\n")
			return
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case l := <-f.feed:
				io.WriteString(w, l+"\n")
				w.(http.Flusher).Flush()
			}
		}
	})
	m.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.posts = append(f.posts, r.URL.Path+" "+string(b)+" actor="+r.Header.Get("X-Shinken-Actor"))
		f.mu.Unlock()
		js(w, `{"ok":true}`)
	})
	return m
}

func startPanel(t *testing.T) (*Server, *fakeAgent) {
	t.Helper()
	sock := t.TempDir() + "/agent.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fa := &fakeAgent{feed: make(chan string, 8)}
	as := httptest.NewUnstartedServer(fa.handler())
	as.Listener = ln
	as.Start()
	t.Cleanup(as.Close)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	s, err := New(Options{Agent: hc, Actor: "panel test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, fa
}

func noRedirect(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string, *http.Response) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

// login redeems the one-time token and returns a client holding the cookie.
func login(t *testing.T, s *Server) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := noRedirect(jar)
	code, _, resp := get(t, c, s.URL())
	if code != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("token: %d, Location %q", code, resp.Header.Get("Location"))
	}
	ck := resp.Cookies()
	if len(ck) != 1 || ck[0].Name != CookieName || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie: %+v", ck)
	}
	return c
}

func TestPanelAuth(t *testing.T) {
	s, fa := startPanel(t)
	base := "http://" + s.Addr()
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") || !strings.Contains(s.URL(), "token=") {
		t.Fatalf("URL %q", s.URL())
	}
	plain := noRedirect(nil)
	for _, p := range []string{"/", "/grants", "/cards", "/events/stream", "/static/panel.js", "/?token=wrong"} {
		if code, body, _ := get(t, plain, base+p); code != http.StatusForbidden {
			t.Errorf("GET %s without the token: %d %s", p, code, body)
		}
	}
	c := login(t, s)
	// The token is one-time: another browser cannot use it again; the one
	// holding the cookie is only sent on.
	if code, _, _ := get(t, plain, s.URL()); code != http.StatusForbidden {
		t.Errorf("second use of the token: %d", code)
	}
	if code, _, resp := get(t, c, s.URL()); code != http.StatusSeeOther || len(resp.Cookies()) != 0 {
		t.Errorf("the token again, with the cookie: %d %v", code, resp.Cookies())
	}
	if code, body, _ := get(t, c, base+"/"); code != http.StatusOK || !strings.Contains(body, "s1") || !strings.Contains(body, "/sys/fs/cgroup/unified/shinken/s1") || !strings.Contains(body, "net.egress: revocable in-kernel") || !strings.Contains(body, "<td>1879048195</td>") {
		t.Errorf("sessions page: %d\n%s", code, body)
	}
	// DNS rebinding: another Host name for the same socket is refused.
	req, _ := http.NewRequest("GET", base+"/", nil)
	req.Host = "evil.example:" + strings.Split(s.Addr(), ":")[1]
	if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("foreign Host: %v %v", resp, err)
	}

	post := func(origin, csrf string) int {
		req, _ := http.NewRequest("POST", base+"/api/revoke", strings.NewReader(`{"id":"g-child"}`))
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if csrf != "" {
			req.Header.Set("X-Panel-CSRF", csrf)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("", s.csrf); code != http.StatusForbidden {
		t.Errorf("POST without Origin: %d", code)
	}
	if code := post("http://evil.example", s.csrf); code != http.StatusForbidden {
		t.Errorf("cross-origin POST: %d", code)
	}
	if code := post(base, ""); code != http.StatusForbidden {
		t.Errorf("POST without the anti-forgery value: %d", code)
	}
	fa.mu.Lock()
	n := len(fa.posts)
	fa.mu.Unlock()
	if n != 0 {
		t.Fatalf("refused POSTs reached the agent: %v", fa.posts)
	}
	if code := post(base, s.csrf); code != http.StatusOK {
		t.Errorf("good POST: %d", code)
	}
	fa.mu.Lock()
	defer fa.mu.Unlock()
	if len(fa.posts) != 1 || !strings.Contains(fa.posts[0], `/v1/grants/revoke {"id":"g-child"}`) || !strings.Contains(fa.posts[0], "actor=panel test") {
		t.Errorf("agent got %v", fa.posts)
	}
}

func TestPanelPages(t *testing.T) {
	s, fa := startPanel(t)
	c := login(t, s)
	base := "http://" + s.Addr()
	_, body, _ := get(t, c, base+"/grants")
	// The child is nested under its parent; the tombstone is not shown.
	pi, ci := strings.Index(body, `data-grant="g-parent"`), strings.Index(body, `data-grant="g-child"`)
	if pi < 0 || ci < pi || strings.Contains(body, "g-dead") || !strings.Contains(body[pi:], "<ul>") {
		t.Errorf("grant tree:\n%s", body)
	}
	// The session's file grants: one row per path with its grant's revoke
	// switch, the admin override marked, revoked grants left out.
	for _, want := range []string{
		`data-grant="g-fs" data-path="/work/out/tmp" data-access="delete"`,
		`data-grant="g-fs" data-path="/work/out" data-access="write"`,
		`data-grant="g-fs" data-path="/work/.git" data-access="deny"`,
		`data-grant="g-keep" data-path="/work/cache" data-access="persist (survives the session)"`,
		`class="revoke" data-grant="g-fs" checked aria-label="file grant g-fs (read /home/u/.ssh) in force"`,
		`fs.scope</b> read=/home/u/.ssh,/work write=/work/out delete=/work/out/tmp deny=/work/.git`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("grants page lacks %q", want)
		}
	}
	if strings.Contains(body, "g-fs-dead") || strings.Count(body, "admin override</span>") != 1 {
		t.Errorf("file rows: a revoked grant shown, or overrides marked %d times, want 1:\n%s", strings.Count(body, "admin override</span>"), body)
	}
	if i := strings.Index(body, `data-path="/home/u/.ssh"`); i < 0 || !strings.Contains(body[i:i+900], "admin override") {
		t.Errorf("the override is not on its path's row")
	}
	_, body, _ = get(t, c, base+"/cards")
	for _, want := range []string{"c-1", "uid:0(alice)", "UseCapability", "192.0.2.10/32 ports=443", "external", "tier:ask", "approve-once", "approve-session", "approve-pattern", `data-action="deny"`} {
		if !strings.Contains(body, want) {
			t.Errorf("cards page lacks %q", want)
		}
	}
	_, body, _ = get(t, c, base+"/enforcement")
	for _, want := range []string{"revocable in-kernel", "unavailable", "not wired", "flow_mode"} {
		if !strings.Contains(body, want) {
			t.Errorf("enforcement page lacks %q", want)
		}
	}
	if _, body, _ = get(t, c, base+"/audit"); !strings.Contains(body, "FAILED") || !strings.Contains(body, "seq 4: hash mismatch") {
		t.Errorf("audit page:\n%s", body)
	}
	if _, body, _ = get(t, c, base+"/events"); !strings.Contains(body, "<td>s1</td><td>no_rule</td><td><code>dst=192.0.2.1:80 pid=1234567</code>") || strings.Contains(body, "grant.issue") {
		t.Errorf("events page (denials only):\n%s", body)
	}

	// The live stream relays the agent's denials as server-sent events.
	req, _ := http.NewRequest("GET", base+"/events/stream", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Do(req.WithContext(ctx))
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	fa.feed <- `{"time":"2026-01-01T00:00:02Z","source":"agent","kind":"grant.issue","data":{}}`
	fa.feed <- `{"time":"2026-01-01T00:00:03Z","source":"kernel","kind":"kernel.deny","data":{"session":"s1","dst":"198.51.100.7:443"}}`
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "grant.issue") {
			t.Fatal("a non-denial was relayed on the denial stream")
		}
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			var r struct{ Kind string }
			if json.Unmarshal([]byte(d), &r) != nil || r.Kind != "kernel.deny" || !strings.Contains(d, "198.51.100.7:443") {
				t.Fatalf("relayed %q", d)
			}
			return
		}
	}
	t.Fatalf("stream ended: %v", sc.Err())
}

func TestPanelURLHasNoOtherListener(t *testing.T) {
	s, _ := startPanel(t)
	u, err := url.Parse(s.URL())
	if err != nil || u.Hostname() != "127.0.0.1" {
		t.Fatalf("URL %q: want 127.0.0.1", s.URL())
	}
}
