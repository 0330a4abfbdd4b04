// Package panel is `shinkenctl panel`: the operator's permission panel, a
// small web UI served by the operator's own shinkenctl process.
//
// It binds 127.0.0.1 on a random port and prints a URL carrying a one-time
// token (the Jupyter pattern): the first request with the token gets an
// HttpOnly, SameSite=Strict session cookie and a redirect to the same page
// without the token, after which the token is spent. Every request without a
// valid cookie (or the unspent token) is answered 403, and so is any request
// whose Host is not the panel's own address (DNS rebinding). A POST must also
// come from the panel's own origin (the Origin header) and carry the page's
// anti-forgery value (X-Panel-CSRF).
//
// The panel talks to the agent over the agent's Unix socket as the process
// that started it, so the agent's peer-credential check applies unchanged:
// the panel adds no network-facing authority. Pages are rendered on the
// server (html/template); the little JavaScript there is (the revoke switches,
// the card buttons, the live denial stream relayed from GET /v1/events as
// server-sent events, the session terminal relayed from the agent's attach
// stream, terminal.go) is embedded in the binary with the styles. Nothing is
// fetched from anywhere at run time.
package panel

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CookieName is the panel's session cookie.
const CookieName = "shinken_panel"

// Options configures a Server.
type Options struct {
	// Agent reaches the agent's API (its transport dials the Unix socket).
	Agent *http.Client
	// Actor names the operator in the agent's audit trail.
	Actor string
	// Port is the loopback port (0: a random one).
	Port int
}

// Server is a running panel.
type Server struct {
	agent *agentClient
	ln    net.Listener
	addr  string // 127.0.0.1:PORT, the only Host accepted
	token string // one-time, in the printed URL
	csrf  string // anti-forgery value embedded in pages, required on POSTs

	mu      sync.Mutex
	spent   bool
	cookies map[string]bool // session cookie values handed out
	mux     *http.ServeMux
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// New listens on 127.0.0.1 (never any other address).
func New(o Options) (*Server, error) {
	if o.Agent == nil {
		return nil, errors.New("panel: no agent client")
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", o.Port))
	if err != nil {
		return nil, fmt.Errorf("panel: listen: %w", err)
	}
	s := &Server{
		agent:   &agentClient{hc: o.Agent, actor: o.Actor},
		ln:      ln,
		addr:    ln.Addr().String(),
		token:   randHex(24),
		csrf:    randHex(24),
		cookies: map[string]bool{},
		mux:     http.NewServeMux(),
	}
	s.routes()
	return s, nil
}

// URL is the address to open, with the one-time token.
func (s *Server) URL() string { return "http://" + s.addr + "/?token=" + s.token }

// Addr is 127.0.0.1:PORT.
func (s *Server) Addr() string { return s.addr }

// Serve serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ServeHTTP authenticates every request, then routes it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if r.Host != s.addr {
		forbid(w, "wrong host: the panel answers only at "+s.addr)
		return
	}
	if tok := r.URL.Query().Get("token"); tok != "" {
		s.redeem(w, r, tok, s.hasCookie(r))
		return
	}
	if !s.hasCookie(r) {
		forbid(w, "no valid panel token: open the URL `shinkenctl panel` printed")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if r.Header.Get("Origin") != "http://"+s.addr {
			forbid(w, "cross-origin request refused")
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Panel-CSRF")), []byte(s.csrf)) != 1 {
			forbid(w, "missing or wrong anti-forgery value")
			return
		}
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	s.mux.ServeHTTP(w, r)
}

func forbid(w http.ResponseWriter, msg string) {
	http.Error(w, "403 forbidden: "+msg, http.StatusForbidden)
}

// redeem trades the one-time token for a session cookie. A browser that
// holds the cookie already (the URL opened again) is only sent on.
func (s *Server) redeem(w http.ResponseWriter, r *http.Request, tok string, hasCookie bool) {
	s.mu.Lock()
	ok := !s.spent && subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) == 1
	var c string
	if ok {
		s.spent = true
		c = randHex(24)
		s.cookies[c] = true
	}
	s.mu.Unlock()
	if !ok && !hasCookie {
		forbid(w, "this token is wrong or was used already: restart `shinkenctl panel` for a new one")
		return
	}
	if ok {
		http.SetCookie(w, &http.Cookie{Name: CookieName, Value: c, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	q := r.URL.Query()
	q.Del("token")
	u := *r.URL
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
}

func (s *Server) hasCookie(r *http.Request) bool {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for v := range s.cookies {
		if subtle.ConstantTimeCompare([]byte(v), []byte(c.Value)) == 1 {
			return true
		}
	}
	return false
}

// Main is `shinkenctl panel [-port N]`: it prints the URL (as {"url": ...}
// with jsonOut) and serves until SIGINT or SIGTERM.
func Main(agent *http.Client, args []string, stdout io.Writer, jsonOut bool) error {
	fs := flag.NewFlagSet("panel", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	port := fs.Int("port", 0, "loopback port (0: a random one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return errors.New("usage: panel [-port N]")
	}
	actor := os.Getenv("SUDO_USER")
	if actor == "" {
		actor = os.Getenv("USER")
	}
	s, err := New(Options{Agent: agent, Actor: strings.TrimSpace("panel " + actor), Port: *port})
	if err != nil {
		return err
	}
	if _, err := s.agent.status(); err != nil {
		s.ln.Close()
		return err
	}
	if jsonOut {
		json.NewEncoder(stdout).Encode(map[string]string{"url": s.URL(), "addr": s.addr})
	} else {
		fmt.Fprintf(stdout, "Shinken panel (Ctrl-C stops it); open this URL, once, in your browser:\n%s\n", s.URL())
	}
	if f, ok := stdout.(*os.File); ok {
		f.Sync()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return s.Serve(ctx)
}
