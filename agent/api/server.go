package api

// The operator API server: configuration, routing, caller authorization,
// error encoding (statusFor maps the agent's and the backend's sentinel
// errors to HTTP codes) and GET /v1/status. The handlers, by resource, are in
// sessions.go, grants.go, approvals.go and events.go.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/procs"
)

// Config wires a Server to the agent's parts.
type Config struct {
	Agent   *agent.Agent
	Backend backend.Backend
	Hub     *Hub
	Auth    Authorizer
	Logger  *slog.Logger
	// Verify checks the audit log (full: every record; otherwise only what
	// was appended since the last verification that passed); nil when the
	// agent keeps none.
	Verify func(full bool) (any, error)
	// Status adds daemon-level facts to GET /v1/status.
	Status func() map[string]any
	// ObserveDecision receives the latency of each POST /v1/decide, as
	// this transport measures it (the agent's own calls, requests and
	// revokes, report theirs in its event stream).
	ObserveDecision func(time.Duration)
	// Processes is the session runtime (processes, attach, run); nil:
	// run starts processes through Agent.Launch, the rest answer 501.
	Processes *procs.Manager
	// RequestTimeout bounds how long a call waits on a process (run); it
	// is not the process's deadline (DefaultRequestTimeout when zero).
	RequestTimeout time.Duration
	// Pprof serves the runtime's profiles under /debug/pprof/ to root
	// callers (debug.go); off unless the operator turns it on.
	Pprof bool
}

// Server serves the /v1 operator API. It is a transport: it decodes a call,
// hands it to the agent (or, for quotas, runs and counters, to the backend)
// and encodes the answer; cards, patterns and batching are the agent's.
type Server struct {
	cfg Config
	mux *http.ServeMux
}

// NewServer builds the server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Agent == nil || cfg.Backend == nil || cfg.Hub == nil {
		return nil, errors.New("api: config needs the agent, the dataplane and a hub")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ObserveDecision == nil {
		cfg.ObserveDecision = func(time.Duration) {}
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	m := s.mux
	m.HandleFunc("GET /v1/status", s.status)
	m.HandleFunc("POST /v1/sessions", s.createSession)
	m.HandleFunc("GET /v1/sessions", s.listSessions)
	m.HandleFunc("GET /v1/sessions/{id}", s.showSession)
	m.HandleFunc("DELETE /v1/sessions/{id}", s.deleteSession)
	m.HandleFunc("DELETE /v1/persisted/{id}", s.forgetPersisted)
	m.HandleFunc("POST /v1/sessions/{id}/run", s.run)
	m.HandleFunc("POST /v1/requests", s.request)
	m.HandleFunc("GET /v1/grants", s.listGrants)
	m.HandleFunc("POST /v1/grants/revoke", s.revoke)
	m.HandleFunc("POST /v1/grants/attenuate", s.attenuate)
	m.HandleFunc("GET /v1/cards", s.listCards)
	m.HandleFunc("GET /v1/cards/{id}", s.showCard)
	m.HandleFunc("POST /v1/cards/{id}/approve", s.approveCard)
	m.HandleFunc("POST /v1/cards/{id}/deny", s.denyCard)
	m.HandleFunc("POST /v1/cards/{id}/cancel", s.cancelCard)
	m.HandleFunc("GET /v1/events", s.events)
	m.HandleFunc("GET /v1/audit/verify", s.verifyAudit)
	m.HandleFunc("POST /v1/decide", s.decide)
	m.HandleFunc("POST /v1/policies", s.policies)
	s.processRoutes(m)
	s.fileRoutes(m)
	if cfg.Pprof {
		s.debugRoutes(m)
	}
	return s, nil
}

// ServeHTTP authorises the caller, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Auth.checkConn(r.Context()); err != nil {
		writeErr(w, http.StatusForbidden, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, bodyLimit(r))
	s.mux.ServeHTTP(w, r)
}

// actor names the human or program behind a call, for the audit trail.
func actor(r *http.Request) string {
	c, _ := CredsFrom(r.Context())
	if h := r.Header.Get("X-Shinken-Actor"); h != "" {
		return fmt.Sprintf("uid:%d(%s)", c.UID, sanitize(h))
	}
	return fmt.Sprintf("uid:%d", c.UID)
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 0x20 && r < 0x7f && len(s) <= 128 {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ---- responses ----

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// writeJSONArray writes the array of n elements elem(0..n-1) in writeJSON's
// bytes, one element encoded at a time through a buffered writer: a list
// of 100,000 sessions never sits in memory whole, nor twice (encoded,
// then indented), as a writeJSON of the slice would have it.
func writeJSONArray(w http.ResponseWriter, code int, n int, elem func(i int) any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if n == 0 {
		io.WriteString(w, "[]\n")
		return
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString("[\n  ")
	for i := range n {
		if i > 0 {
			bw.WriteString(",\n  ")
		}
		b, err := json.MarshalIndent(elem(i), "  ", "  ")
		if err != nil {
			// As writeJSON: an element that cannot be encoded ends the
			// body (the status is sent); the client sees invalid JSON.
			bw.Flush()
			return
		}
		bw.Write(b)
	}
	bw.WriteString("\n]\n")
	bw.Flush()
}

// writeCompact is writeJSON without the indentation, for the answer a
// program reads on the hot path (POST /v1/decide): indenting was a tenth of
// the handler's time.
func writeCompact(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, Error{Error: err.Error(), Code: http.StatusText(code)})
}

// statusFor maps the agent's and dataplane's sentinel errors to HTTP codes.
func statusFor(err error) int {
	switch {
	case errors.Is(err, agent.ErrInvalidRequest), errors.Is(err, backend.ErrInvalidPrefix),
		errors.Is(err, backend.ErrInvalidPorts), errors.Is(err, backend.ErrInvalidSession),
		errors.Is(err, agent.ErrForgedHandle), errors.Is(err, agent.ErrInvalidCapability),
		errors.Is(err, backend.ErrInvalidProto), errors.Is(err, backend.ErrInvalidHandle),
		errors.Is(err, backend.ErrChainTooDeep), errors.Is(err, backend.ErrCoverTooDeep),
		errors.Is(err, agent.ErrLaunch), errors.Is(err, backend.ErrExecFailed):
		return http.StatusBadRequest
	case errors.Is(err, agent.ErrUnknownSession), errors.Is(err, backend.ErrSessionNotFound),
		errors.Is(err, agent.ErrUnknownApproval), errors.Is(err, agent.ErrUnknownHandle), errors.Is(err, agent.ErrUnknownCard):
		return http.StatusNotFound
	case errors.Is(err, agent.ErrSessionExists), errors.Is(err, backend.ErrSessionExists), errors.Is(err, agent.ErrCardDecided):
		return http.StatusConflict
	case errors.Is(err, agent.ErrDenied), errors.Is(err, agent.ErrBlockTier), errors.Is(err, agent.ErrStandingInSession),
		errors.Is(err, agent.ErrOutsideManifest), errors.Is(err, agent.ErrBreakerTripped), errors.Is(err, agent.ErrNotEnforceable),
		errors.Is(err, agent.ErrSessionInactive), errors.Is(err, agent.ErrApprovalExpired),
		errors.Is(err, agent.ErrWidens), errors.Is(err, agent.ErrHandleRevoked), errors.Is(err, backend.ErrExecDenied):
		return http.StatusForbidden
	case errors.Is(err, backend.ErrLimitsUnsupported):
		return http.StatusUnprocessableEntity
	case errors.Is(err, backend.ErrMapFull), errors.Is(err, backend.ErrRulesFull),
		errors.Is(err, agent.ErrState) && errors.Is(err, syscall.ENOSPC):
		// A full table, or a full disk under the agent's state: nothing
		// changed; the same call succeeds once there is room.
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// decode reads a JSON body strictly: unknown fields and trailing data are errors.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: body: %v", agent.ErrInvalidRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: body: trailing data", agent.ErrInvalidRequest)
	}
	return nil
}

// ---- status ----

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	sessions := s.cfg.Agent.Sessions()
	rep := s.cfg.Backend.Probe()
	st := map[string]any{
		"sessions":    len(sessions),
		"enforcement": s.cfg.Agent.Enforcement(),
		"backend":     rep,
		// Which forbids the kernel enforces, and which only decide time.
		"forbids": s.cfg.Agent.Forbids(),
	}
	if p, ok := rep.Facts["cgroup_parent"]; ok {
		st["cgroup"] = p
	}
	if port, err := s.cfg.Backend.DNSRedirect(); err == nil {
		st["dns_redirect_port"] = port
	}
	if s.cfg.Status != nil {
		for k, v := range s.cfg.Status() {
			st[k] = v
		}
	}
	writeJSON(w, http.StatusOK, st)
}
