package panel

// The panel's terminal: a page with a small terminal (terminal.js) on a
// process the panel starts in a session (a shell with a PTY), and the
// WebSocket that relays the page to the agent's attach stream. The page's
// origin is checked on the upgrade as on every POST (a WebSocket upgrade is
// a GET, which ServeHTTP does not check for Origin), besides the session
// cookie; the agent checks the caller (this process) as for any call.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"github.com/coder/websocket"
	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
)

func (s *Server) terminalRoutes() {
	s.mux.HandleFunc("GET /terminal", s.terminalPage)
	s.mux.HandleFunc("POST /api/sessions/{id}/terminal", s.startTerminal)
	s.mux.HandleFunc("GET /api/sessions/{id}/processes/{pid}/attach", s.relayAttach)
}

func (s *Server) terminalPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("session")
	var err error
	if id == "" {
		err = errors.New("no session named (?session=ID)")
	}
	s.render(w, "terminal", "Terminal", map[string]string{"Session": id}, err)
}

// startTerminal starts an interactive shell with a terminal of the asked
// size in the session; it answers the process's view.
func (s *Server) startTerminal(w http.ResponseWriter, r *http.Request) {
	var size wire.TermSize
	if err := json.NewDecoder(r.Body).Decode(&size); err != nil || size.Rows == 0 || size.Cols == 0 {
		writeJSONErr(w, http.StatusBadRequest, errors.New("want {\"rows\",\"cols\"}"))
		return
	}
	id := r.PathValue("id")
	req := wire.ProcessStart{Argv: []string{"/bin/bash", "-i"}, TTY: &size, Interactive: true,
		Env: append(backend.DefaultEnv(id), "TERM=dumb", "PS1=\\u@"+id+":\\w\\$ ")}
	var p wire.Process
	if err := s.agent.call(r.Context(), "POST", "/v1/sessions/"+url.PathEscape(id)+"/processes", req, &p); err != nil {
		code := http.StatusBadGateway
		var ae *apiError
		if errors.As(err, &ae) {
			code = ae.Status
		}
		writeJSONErr(w, code, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(p)
}

func writeJSONErr(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// relayAttach relays a WebSocket from the page to the agent's attach
// stream of the same process, message for message.
func (s *Server) relayAttach(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Origin") != "http://"+s.addr {
		forbid(w, "cross-origin request refused")
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	u := "ws://shinken/v1/sessions/" + url.PathEscape(r.PathValue("id")) + "/processes/" + url.PathEscape(r.PathValue("pid")) + "/attach"
	if q := r.URL.RawQuery; q != "" {
		u += "?" + q
	}
	h := http.Header{}
	h.Set("X-Shinken-Actor", s.agent.actor)
	up, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: s.agent.hc, HTTPHeader: h, Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		code := http.StatusBadGateway
		if resp != nil && resp.StatusCode >= 400 {
			code = resp.StatusCode
		}
		http.Error(w, "agent attach: "+err.Error(), code)
		return
	}
	defer up.CloseNow()
	down, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		return
	}
	defer down.CloseNow()
	up.SetReadLimit(1 << 21)
	down.SetReadLimit(1 << 20)
	relay := func(from, to *websocket.Conn) {
		defer cancel()
		for {
			typ, m, err := from.Read(ctx)
			if err != nil {
				var ce websocket.CloseError
				if errors.As(err, &ce) {
					to.Close(ce.Code, ce.Reason)
				}
				return
			}
			if err := to.Write(ctx, typ, m); err != nil {
				return
			}
		}
	}
	go relay(down, up)
	relay(up, down)
}
