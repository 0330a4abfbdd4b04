package api

// Processes over HTTP (the session runtime, agent/procs): start, list,
// show, signal, kill, logs and attach (a WebSocket, attach.go), exec (start
// and attach in one request), and run, the one-shot form on the same path.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/procs"
)

// DefaultRequestTimeout bounds how long one call waits on a process (run)
// when Config.RequestTimeout is zero. It is the request's deadline, not the
// process's: a process outlives it.
const DefaultRequestTimeout = 60 * time.Second

func (s *Server) processRoutes(m *http.ServeMux) {
	m.HandleFunc("POST /v1/sessions/{id}/processes", s.startProcess)
	m.HandleFunc("GET /v1/sessions/{id}/processes", s.listProcesses)
	m.HandleFunc("GET /v1/sessions/{id}/processes/{pid}", s.showProcess)
	m.HandleFunc("DELETE /v1/sessions/{id}/processes/{pid}", s.killProcess)
	m.HandleFunc("POST /v1/sessions/{id}/processes/{pid}/signal", s.signalProcess)
	m.HandleFunc("GET /v1/sessions/{id}/processes/{pid}/logs", s.processLogs)
	m.HandleFunc("GET /v1/sessions/{id}/processes/{pid}/attach", s.attach)
	m.HandleFunc("GET /v1/sessions/{id}/exec", s.execProcess)
	m.HandleFunc("POST /v1/sessions/{id}/pause", s.pause)
	m.HandleFunc("POST /v1/sessions/{id}/resume", s.resume)
}

func procStatus(err error) int {
	switch {
	case errors.Is(err, procs.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, procs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, procs.ErrNotActive):
		return http.StatusConflict
	}
	return statusFor(err)
}

func (s *Server) procs(w http.ResponseWriter) *procs.Manager {
	if s.cfg.Processes == nil {
		writeErr(w, http.StatusNotImplemented, errors.New("this agent runs no session runtime (no process manager configured)"))
	}
	return s.cfg.Processes
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	m := s.procs(w)
	if m == nil {
		return
	}
	var req wire.ProcessStart
	if err := decode(r, &req); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	p := s.start(w, r, m, req)
	if p == nil {
		return
	}
	writeJSON(w, http.StatusCreated, p.View())
}

// start starts req in the session the request names, for startProcess and
// execProcess, after the Origin check attach has (coder/websocket's, in
// Accept), made here before the start: a browser page cannot start a
// process cross-site only to have its upgrade refused. On an error it
// answers and returns nil.
func (s *Server) start(w http.ResponseWriter, r *http.Request, m *procs.Manager, req wire.ProcessStart) *procs.Proc {
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || !strings.EqualFold(u.Host, r.Host) {
			writeErr(w, http.StatusForbidden, fmt.Errorf("exec: request Origin %q is not %q", o, r.Host))
			return nil
		}
	}
	id := r.PathValue("id")
	if _, err := s.find(id); err != nil {
		writeErr(w, statusFor(err), err)
		return nil
	}
	p, err := m.Start(id, req, actor(r))
	if err != nil {
		writeErr(w, procStatus(err), err)
		return nil
	}
	return p
}

// execProcess is POST .../processes and GET .../attach in one request:
// GET /v1/sessions/{id}/exec?start=JSON, the JSON a wire.ProcessStart,
// upgraded to the attach WebSocket from offset 0 once the process has
// started (its id in the 101 answer's X-Shinken-Process header). A bad
// start, an unknown session or a request that is no WebSocket upgrade is
// answered with its error before anything starts, and so is one from
// a browser page of another origin. A client that goes away
// takes nothing with it, as with attach: the process runs on.
func (s *Server) execProcess(w http.ResponseWriter, r *http.Request) {
	m := s.procs(w)
	if m == nil {
		return
	}
	var req wire.ProcessStart
	dec := json.NewDecoder(strings.NewReader(r.URL.Query().Get("start")))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: start: %v", agent.ErrInvalidRequest, err))
		return
	}
	if dec.More() {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: start: trailing data", agent.ErrInvalidRequest))
		return
	}
	if !headerHas(r.Header, "Connection", "upgrade") || !headerHas(r.Header, "Upgrade", "websocket") ||
		!headerHas(r.Header, "Sec-WebSocket-Protocol", wire.AttachProtocol) {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: exec is a WebSocket upgrade with subprotocol %s", agent.ErrInvalidRequest, wire.AttachProtocol))
		return
	}
	p := s.start(w, r, m, req)
	if p == nil {
		return
	}
	w.Header().Set("X-Shinken-Process", p.View().ID)
	s.stream(w, r, p, [2]uint64{})
}

// headerHas says whether a comma-separated header h lists token (case
// insensitive).
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	m := s.procs(w)
	if m == nil {
		return
	}
	id := r.PathValue("id")
	if _, err := s.find(id); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	writeJSON(w, http.StatusOK, m.List(id))
}

func (s *Server) proc(w http.ResponseWriter, r *http.Request) *procs.Proc {
	m := s.procs(w)
	if m == nil {
		return nil
	}
	p, err := m.Get(r.PathValue("id"), r.PathValue("pid"))
	if err != nil {
		writeErr(w, procStatus(err), err)
		return nil
	}
	return p
}

func (s *Server) showProcess(w http.ResponseWriter, r *http.Request) {
	if p := s.proc(w, r); p != nil {
		writeJSON(w, http.StatusOK, p.View())
	}
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	if err := p.Kill(); err != nil {
		writeErr(w, procStatus(err), err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	p.Wait(ctx)
	writeJSON(w, http.StatusOK, p.View())
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	var req wire.ProcessSignal
	if err := decode(r, &req); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	sig, err := procs.ParseSignal(req.Signal)
	if err != nil {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: %v", agent.ErrInvalidRequest, err))
		return
	}
	if err := p.Signal(sig); err != nil {
		writeErr(w, procStatus(err), err)
		return
	}
	writeJSON(w, http.StatusOK, p.View())
}

// processLogs streams one output stream as raw bytes: stream=stdout|stderr,
// from=OFFSET (default 0), follow=1 to wait for more until the process
// ends. X-Shinken-Offset says where the bytes begin, X-Shinken-Dropped how
// many asked for were no longer in the ring; the trailer X-Shinken-Gap, when
// the stream stopped at bytes the process overwrote before they were sent,
// how many (the client asks again from after them).
func (s *Server) processLogs(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	q := r.URL.Query()
	stream := 0
	switch q.Get("stream") {
	case "", "stdout":
	case "stderr":
		stream = 1
	default:
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: stream %q (stdout or stderr)", agent.ErrInvalidRequest, q.Get("stream")))
		return
	}
	var off uint64
	if f := q.Get("from"); f != "" {
		var err error
		if off, err = strconv.ParseUint(f, 10, 64); err != nil {
			writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: from %q", agent.ErrInvalidRequest, f))
			return
		}
	}
	follow := q.Get("follow") == "1" || q.Get("follow") == "true"
	c, err := p.Read(stream, off, 0)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Shinken-Offset", strconv.FormatUint(c.Offset, 10))
	w.Header().Set("X-Shinken-Dropped", strconv.FormatUint(c.Dropped, 10))
	w.Header().Set("Trailer", "X-Shinken-Gap")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	off = c.Offset
	for {
		var ch procs.Chunk
		ok := true
		if follow {
			ch, ok, err = p.Next(r.Context(), stream, off, 256<<10)
		} else {
			ch, err = p.Read(stream, off, 256<<10)
			ok = len(ch.Data) > 0
		}
		// A gap (bytes overwritten while this stream was sent) ends it,
		// said in the trailer: the client asks again from after it.
		if err == nil && ok && ch.Offset > off {
			w.Header().Set("X-Shinken-Gap", strconv.FormatUint(ch.Offset-off, 10))
			return
		}
		if err != nil || !ok {
			return
		}
		if _, err := w.Write(ch.Data); err != nil {
			return
		}
		off = ch.Offset + uint64(len(ch.Data))
		if fl != nil {
			fl.Flush()
		}
	}
}

// run is the one-shot form: a process (its deadline the run's timeout,
// default 60 s) started and waited for. The request's own deadline
// (Config.RequestTimeout) is a separate setting: when it passes first the
// answer says the process still runs (Running, Process: its id), and it
// keeps running to its end or its deadline. So does a run whose client goes
// away. Stdout and Stderr are the last bytes of each stream, at most
// MaxRunOutput (Truncated: earlier bytes are not in the answer).
func (s *Server) runProcess(w http.ResponseWriter, r *http.Request, m *procs.Manager) {
	id := r.PathValue("id")
	var req RunRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	if _, err := s.find(id); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	deadline := 60.0
	if req.TimeoutS > 0 {
		deadline = min(req.TimeoutS, 3600)
	}
	ps := wire.ProcessStart{Argv: req.Argv, UID: req.UID, GID: req.GID, Stdin: &req.Stdin, DeadlineS: deadline, Cwd: "/"}
	p, err := m.Start(id, ps, actor(r))
	if err != nil {
		writeErr(w, procStatus(err), err)
		return
	}
	rt := s.cfg.RequestTimeout
	if rt <= 0 {
		rt = DefaultRequestTimeout
	}
	ctx, cancel := context.WithTimeout(r.Context(), rt)
	defer cancel()
	werr := p.Wait(ctx)
	v := p.View()
	res := RunResult{PID: v.PID, Process: v.ID}
	for i, out := range []*string{&res.Stdout, &res.Stderr} {
		end := [2]uint64{v.Stdout, v.Stderr}[i]
		from := end - min(end, MaxRunOutput)
		c, err := p.Read(i, from, MaxRunOutput)
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
		*out = string(c.Data)
		res.Truncated = res.Truncated || c.Offset > 0
	}
	switch {
	case werr != nil:
		res.Running = true
	case v.ExitCode != nil:
		res.ExitCode = *v.ExitCode
	default:
		res.ExitCode = -1
		res.TimedOut = v.Reason == "deadline"
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request)  { s.setPaused(w, r, true) }
func (s *Server) resume(w http.ResponseWriter, r *http.Request) { s.setPaused(w, r, false) }

func (s *Server) setPaused(w http.ResponseWriter, r *http.Request, paused bool) {
	id := r.PathValue("id")
	f := s.cfg.Agent.Resume
	if paused {
		f = s.cfg.Agent.Pause
	}
	if err := f(id, actor(r)); err != nil {
		code := statusFor(err)
		if errors.Is(err, agent.ErrNotPausable) {
			code = http.StatusNotImplemented
		}
		writeErr(w, code, err)
		return
	}
	p, _ := s.cfg.Agent.Paused(id)
	writeJSON(w, http.StatusOK, wire.PauseState{Session: id, Paused: p})
}
