package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

// Config wires a Server to the agent's parts.
type Config struct {
	Agent    *agent.Agent
	Backend  backend.Backend
	Hub      *Hub
	Auth     Authorizer
	StateDir string
	Logger   *slog.Logger
	// Verify checks the audit log; nil when the agent keeps none.
	Verify func() (any, error)
	// Status adds daemon-level facts to GET /v1/status.
	Status func() map[string]any
	// OnSessionEnd is called after a session is deleted (metrics cleanup).
	OnSessionEnd func(session string)
	// OnGrantsChanged is called after a call that may have changed grants,
	// so the daemon applies what changed (DNS allowlists) at once rather
	// than at its next tick.
	OnGrantsChanged func()
	// Audit records what the API sees (requests, attenuations, runs, card
	// decisions). An error fails the call before anything happens.
	Audit func(kind string, fields map[string]any) error
	// ObserveRevoke and ObserveDecision receive latencies for metrics: a
	// revoke call, and the decision of a request (Cedar, tiers and, when
	// granted, the kernel writes of the grant).
	ObserveRevoke, ObserveDecision func(time.Duration)
}

// Server serves the /v1 operator API.
type Server struct {
	cfg   Config
	cards *cardStore
	mux   *http.ServeMux
	runMu sync.Mutex
}

// MaxRunOutput caps what /run returns of a command's stdout and stderr each.
const MaxRunOutput = 1 << 20

// NewServer builds the server and loads the persisted cards.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Agent == nil || cfg.Backend == nil || cfg.Hub == nil {
		return nil, errors.New("api: config needs the agent, the dataplane and a hub")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Audit == nil {
		cfg.Audit = func(string, map[string]any) error { return nil }
	}
	if cfg.ObserveRevoke == nil {
		cfg.ObserveRevoke = func(time.Duration) {}
	}
	if cfg.ObserveDecision == nil {
		cfg.ObserveDecision = func(time.Duration) {}
	}
	cards, err := openCards(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, cards: cards, mux: http.NewServeMux()}
	s.syncCards()
	m := s.mux
	m.HandleFunc("GET /v1/status", s.status)
	m.HandleFunc("POST /v1/sessions", s.createSession)
	m.HandleFunc("GET /v1/sessions", s.listSessions)
	m.HandleFunc("GET /v1/sessions/{id}", s.showSession)
	m.HandleFunc("DELETE /v1/sessions/{id}", s.deleteSession)
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
	return s, nil
}

// ServeHTTP authorises the caller, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, ok := CredsFrom(r.Context())
	if !ok {
		writeErr(w, http.StatusForbidden, errors.New("permission denied: no peer credentials (the API is served on a Unix socket only)"))
		return
	}
	if err := s.cfg.Auth.Check(c); err != nil {
		writeErr(w, http.StatusForbidden, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
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

// Error is the body of every non-2xx response.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, Error{Error: err.Error(), Code: http.StatusText(code)})
}

// statusFor maps the agent's and dataplane's sentinel errors to HTTP codes.
func statusFor(err error) int {
	switch {
	case errors.Is(err, agent.ErrInvalidRequest), errors.Is(err, backend.ErrInvalidPrefix),
		errors.Is(err, backend.ErrInvalidPorts), errors.Is(err, backend.ErrInvalidSession),
		errors.Is(err, agent.ErrForgedHandle):
		return http.StatusBadRequest
	case errors.Is(err, agent.ErrUnknownSession), errors.Is(err, backend.ErrSessionNotFound),
		errors.Is(err, agent.ErrUnknownApproval), errors.Is(err, agent.ErrUnknownHandle), errors.Is(err, errNoCard):
		return http.StatusNotFound
	case errors.Is(err, agent.ErrSessionExists), errors.Is(err, backend.ErrSessionExists), errors.Is(err, errCardDecided):
		return http.StatusConflict
	case errors.Is(err, agent.ErrDenied), errors.Is(err, agent.ErrBlockTier), errors.Is(err, agent.ErrStandingInSession),
		errors.Is(err, agent.ErrOutsideManifest), errors.Is(err, agent.ErrBreakerTripped), errors.Is(err, agent.ErrNotEnforceable),
		errors.Is(err, agent.ErrSessionInactive), errors.Is(err, agent.ErrApprovalExpired):
		return http.StatusForbidden
	case errors.Is(err, backend.ErrLimitsUnsupported):
		return http.StatusUnprocessableEntity
	case errors.Is(err, backend.ErrMapFull), errors.Is(err, backend.ErrRulesFull):
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

// ---- sessions ----

// SessionView is a session as the API shows it.
type SessionView struct {
	agent.SessionSpec
	Index    uint32                         `json:"index"`
	CgroupID uint64                         `json:"cgroup_id"`
	Path     string                         `json:"cgroup"`
	Denials  map[string]uint64              `json:"denials,omitempty"`
	Grants   []agent.GrantInfo              `json:"grants,omitempty"`
	Breaker  *agent.BreakerState            `json:"breaker,omitempty"`
	Domains  map[string][]backend.HandleRef `json:"domains,omitempty"`
}

func (s *Server) view(spec agent.SessionSpec, detail bool) SessionView {
	v := SessionView{SessionSpec: spec}
	if ks, err := s.cfg.Backend.Session(spec.ID); err == nil {
		v.Index, v.CgroupID, v.Path = ks.Index, ks.CgroupID, ks.Path
		if detail {
			if c, err := s.cfg.Backend.Counters(ks.Index); err == nil {
				v.Denials = map[string]uint64{}
				for i, n := range c {
					if n > 0 {
						v.Denials[backend.Reason(i).String()] = n
					}
				}
			}
		}
	}
	if detail {
		v.Grants = s.cfg.Agent.Grants(spec.ID)
		if b, err := s.cfg.Agent.Breaker(spec.ID); err == nil {
			v.Breaker = &b
		}
		v.Domains = s.cfg.Agent.EgressDomains(spec.ID)
	}
	return v
}

// CreateSessionBody is a session spec plus its cgroup quotas.
type CreateSessionBody struct {
	agent.SessionSpec
	Quotas backend.Limits `json:"quotas,omitzero"`
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var body CreateSessionBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	spec := body.SessionSpec
	// Quotas the host cannot enforce are refused before anything exists.
	if err := s.cfg.Backend.CheckLimits(body.Quotas); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	if err := s.cfg.Agent.CreateSession(spec); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	if err := s.cfg.Backend.SetLimits(spec.ID, body.Quotas); err != nil {
		// Fail closed: no session without the quotas it was asked with.
		err = errors.Join(err, s.cfg.Agent.EndSession(spec.ID))
		writeErr(w, statusFor(err), err)
		return
	}
	for _, sp := range s.cfg.Agent.Sessions() {
		if sp.ID == spec.ID {
			writeJSON(w, http.StatusCreated, s.view(sp, false))
			return
		}
	}
	writeErr(w, http.StatusInternalServerError, errors.New("session vanished after create"))
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	specs := s.cfg.Agent.Sessions()
	out := make([]SessionView, 0, len(specs))
	for _, sp := range specs {
		out = append(out, s.view(sp, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) find(id string) (agent.SessionSpec, error) {
	for _, sp := range s.cfg.Agent.Sessions() {
		if sp.ID == id {
			return sp, nil
		}
	}
	return agent.SessionSpec{}, fmt.Errorf("%w: %q", agent.ErrUnknownSession, id)
}

func (s *Server) showSession(w http.ResponseWriter, r *http.Request) {
	sp, err := s.find(r.PathValue("id"))
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	writeJSON(w, http.StatusOK, s.view(sp, true))
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := s.find(id); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	if err := s.cfg.Agent.EndSession(id); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	if s.cfg.OnSessionEnd != nil {
		s.cfg.OnSessionEnd(id)
	}
	s.syncCards()
	writeJSON(w, http.StatusOK, map[string]string{"deleted": id})
}

// RunRequest runs a command inside a session.
type RunRequest struct {
	Argv     []string `json:"argv"`
	Stdin    string   `json:"stdin,omitempty"`
	TimeoutS float64  `json:"timeout_s,omitempty"` // default 60, at most 3600
	UID      uint32   `json:"uid,omitempty"`       // default nobody; never 0
	GID      uint32   `json:"gid,omitempty"`
}

// RunResult is what the command did.
type RunResult struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	PID       int    `json:"pid"`
}

type capped struct {
	buf       bytes.Buffer
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := MaxRunOutput - c.buf.Len(); room < len(p) {
		if room > 0 {
			c.buf.Write(p[:room])
		}
		c.truncated = true
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (s *Server) run(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req RunRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: argv is empty", agent.ErrInvalidRequest))
		return
	}
	if req.UID == 0 && req.GID != 0 {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: gid without uid", agent.ErrInvalidRequest))
		return
	}
	timeout := 60 * time.Second
	if req.TimeoutS > 0 {
		timeout = time.Duration(min(req.TimeoutS, 3600) * float64(time.Second))
	}
	if _, err := s.find(id); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	ks, err := s.cfg.Backend.Session(id)
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	if err := s.cfg.Audit("run", map[string]any{"actor": actor(r), "session": id, "tool": req.Argv[0], "params": req.Argv, "outcome": "started"}); err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, req.Argv[0], req.Argv[1:]...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/nonexistent", "SHINKEN_SESSION=" + id}
	cmd.Dir = "/"
	var stdout, stderr capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = strings.NewReader(req.Stdin)
	if err := s.cfg.Backend.Launch(ks.Name, cmd, backend.LaunchOptions{UID: req.UID, GID: req.GID}); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	s.cfg.Hub.Publish("api", "session.run", map[string]any{"session": id, "argv0": req.Argv[0], "pid": cmd.Process.Pid, "actor": actor(r)})
	err = cmd.Wait()
	res := RunResult{Stdout: stdout.buf.String(), Stderr: stderr.buf.String(), Truncated: stdout.truncated || stderr.truncated, PID: cmd.Process.Pid}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	default:
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	if ctx.Err() != nil {
		res.TimedOut = true
	}
	writeJSON(w, http.StatusOK, res)
}

// ---- requests, grants ----

// RequestBody asks for one or more capabilities. Requests that need a human
// are batched into cards: one card per session and tier.
type RequestBody struct {
	Requests []agent.GrantRequest `json:"requests"`
}

// RequestResult is the outcome of one request.
type RequestResult struct {
	Outcome string       `json:"outcome"` // granted | pending | denied | invalid
	Grant   *agent.Grant `json:"grant,omitempty"`
	Card    string       `json:"card,omitempty"`
	Reason  string       `json:"reason,omitempty"`
	Status  int          `json:"status"`
}

func (s *Server) request(w http.ResponseWriter, r *http.Request) {
	var body RequestBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	if len(body.Requests) == 0 || len(body.Requests) > 64 {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: want 1 to 64 requests", agent.ErrInvalidRequest))
		return
	}
	who := actor(r)
	results := make([]RequestResult, len(body.Requests))
	pendingByKey := map[string][]agent.ApprovalRecord{}
	var keys []string
	for i, req := range body.Requests {
		if req.Requester == "" {
			req.Requester = who
		}
		if err := s.cfg.Audit("request", map[string]any{"actor": who, "agent": req.Requester, "session": req.Session,
			"resource": string(req.Capability.Class), "params": req.Capability, "provenance": string(req.Provenance),
			"lifetime": string(req.Lifecycle), "parent": req.Parent}); err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
		t0 := time.Now()
		g, err := s.cfg.Agent.Grant(r.Context(), req)
		s.cfg.ObserveDecision(time.Since(t0))
		var are *agent.ApprovalRequiredError
		switch {
		case err == nil:
			results[i] = RequestResult{Outcome: "granted", Grant: g, Status: http.StatusCreated}
			s.grantsChanged()
		case errors.As(err, &are):
			// A pattern the human approved earlier answers it now.
			s.cards.mu.Lock()
			p, ok := s.cards.matchPattern(req)
			s.cards.mu.Unlock()
			if ok {
				g, err := s.cfg.Agent.ApproveAs(r.Context(), are.ID, "pattern:"+p.Card+" by "+p.Decider, agent.LifecycleSession)
				if err == nil {
					results[i] = RequestResult{Outcome: "granted", Grant: g, Status: http.StatusCreated, Reason: "approved by pattern " + p.Card}
					s.grantsChanged()
				} else {
					results[i] = RequestResult{Outcome: "denied", Reason: err.Error(), Status: statusFor(err)}
				}
				continue
			}
			ap := s.pendingApproval(are.ID)
			key := req.Session + "\x00" + are.Tier.String()
			if _, ok := pendingByKey[key]; !ok {
				keys = append(keys, key)
			}
			pendingByKey[key] = append(pendingByKey[key], ap)
			results[i] = RequestResult{Outcome: "pending", Status: http.StatusAccepted, Reason: fmt.Sprintf("tier %s needs a human", are.Tier)}
			results[i].Card = key // replaced below
		default:
			out := "denied"
			if statusFor(err) == http.StatusBadRequest {
				out = "invalid"
			}
			results[i] = RequestResult{Outcome: out, Reason: err.Error(), Status: statusFor(err)}
		}
	}
	// One card per (session, tier): siblings batched, never across tiers.
	cardOf := map[string]string{}
	if len(keys) > 0 {
		s.cards.mu.Lock()
		for _, key := range keys {
			aps := pendingByKey[key]
			c := &Card{ID: newCardID(), Session: aps[0].Request.Session, Tier: aps[0].Tier, Created: aps[0].Created, Expires: aps[0].Expires, Status: "pending"}
			for _, ap := range aps {
				c.Items = append(c.Items, itemFor(ap))
			}
			s.cards.Cards[c.ID] = c
			cardOf[key] = c.ID
			s.cfg.Hub.Publish("api", "card.open", c)
		}
		err := s.cards.save()
		s.cards.mu.Unlock()
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
	}
	for i := range results {
		if results[i].Outcome == "pending" {
			results[i].Card = cardOf[results[i].Card]
		}
	}
	code := http.StatusOK
	if len(results) == 1 {
		code = results[0].Status
	}
	writeJSON(w, code, results)
}

func (s *Server) pendingApproval(id string) agent.ApprovalRecord {
	for _, ap := range s.cfg.Agent.PendingApprovals() {
		if ap.ID == id {
			return ap
		}
	}
	return agent.ApprovalRecord{ID: id}
}

func (s *Server) grantsChanged() {
	if s.cfg.OnGrantsChanged != nil {
		s.cfg.OnGrantsChanged()
	}
}

func (s *Server) listGrants(w http.ResponseWriter, r *http.Request) {
	session := r.URL.Query().Get("session")
	var out []agent.GrantInfo
	if session != "" {
		if _, err := s.find(session); err != nil {
			writeErr(w, statusFor(err), err)
			return
		}
		out = s.cfg.Agent.Grants(session)
	} else {
		for _, sp := range s.cfg.Agent.Sessions() {
			out = append(out, s.cfg.Agent.Grants(sp.ID)...)
		}
	}
	if out == nil {
		out = []agent.GrantInfo{}
	}
	writeJSON(w, http.StatusOK, out)
}

// RevokeBody names a grant by handle token or by grant id.
type RevokeBody struct {
	Handle string `json:"handle,omitempty"`
	ID     string `json:"id,omitempty"`
}

func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	var body RevokeBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	var err error
	t0 := time.Now()
	defer func() {
		if err == nil {
			s.cfg.ObserveRevoke(time.Since(t0))
		}
	}()
	switch {
	case body.Handle != "" && body.ID == "":
		err = s.cfg.Agent.Revoke(r.Context(), body.Handle)
	case body.ID != "" && body.Handle == "":
		err = s.cfg.Agent.RevokeGrant(r.Context(), body.ID)
	default:
		err = fmt.Errorf("%w: name the grant by handle or by id (one of them)", agent.ErrInvalidRequest)
	}
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	s.grantsChanged()
	writeJSON(w, http.StatusOK, map[string]string{"revoked": body.Handle + body.ID})
}

// AttenuateBody derives a narrower grant from Parent (a handle token).
type AttenuateBody struct {
	Parent  string             `json:"parent"`
	Request agent.GrantRequest `json:"request"`
}

func (s *Server) attenuate(w http.ResponseWriter, r *http.Request) {
	var body AttenuateBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	if body.Request.Requester == "" {
		body.Request.Requester = actor(r)
	}
	g, err := s.cfg.Agent.Attenuate(r.Context(), body.Parent, body.Request)
	outcome, handle := "granted", ""
	if err != nil {
		outcome = "refused: " + err.Error()
	} else {
		handle = g.ID
	}
	if aerr := s.cfg.Audit("attenuate", map[string]any{"actor": actor(r), "agent": body.Request.Requester, "session": body.Request.Session,
		"resource": string(body.Request.Capability.Class), "params": body.Request.Capability, "outcome": outcome, "handle": handle}); aerr != nil && err == nil {
		s.cfg.Logger.Error("audit attenuate", "err", aerr)
	}
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	s.grantsChanged()
	writeJSON(w, http.StatusCreated, g)
}

// ---- cards ----

var (
	errNoCard      = errors.New("no such card")
	errCardDecided = errors.New("card already decided")
)

// syncCards reconciles the cards with the agent's pending approvals.
func (s *Server) syncCards() {
	pending := s.cfg.Agent.PendingApprovals()
	s.cards.mu.Lock()
	defer s.cards.mu.Unlock()
	changed := s.cards.sync(pending)
	if len(changed) > 0 {
		if err := s.cards.save(); err != nil {
			s.cfg.Logger.Error("save cards", "err", err)
		}
		for _, c := range changed {
			if c.Status == "timed_out" {
				s.cfg.Hub.Publish("api", "card.timed_out", c)
			}
		}
	}
}

// SyncCards is for the daemon's sweeper: after the agent times approvals out,
// their cards are marked timed_out.
func (s *Server) SyncCards() { s.syncCards() }

func (s *Server) listCards(w http.ResponseWriter, r *http.Request) {
	s.syncCards()
	all := r.URL.Query().Get("all") != ""
	s.cards.mu.Lock()
	defer s.cards.mu.Unlock()
	out := []*Card{}
	for _, c := range s.cards.list() {
		if all || c.Status == "pending" {
			out = append(out, c)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) showCard(w http.ResponseWriter, r *http.Request) {
	s.syncCards()
	s.cards.mu.Lock()
	defer s.cards.mu.Unlock()
	c, ok := s.cards.Cards[r.PathValue("id")]
	if !ok {
		writeErr(w, http.StatusNotFound, fmt.Errorf("%w: %s", errNoCard, r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// ApproveBody says how far an approval reaches.
type ApproveBody struct {
	Mode string `json:"mode"` // once | session | pattern
}

func (s *Server) pendingCard(id string) (*Card, error) {
	c, ok := s.cards.Cards[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", errNoCard, id)
	}
	if c.Status != "pending" {
		return nil, fmt.Errorf("%w: %s is %s", errCardDecided, id, c.Status)
	}
	return c, nil
}

func (s *Server) approveCard(w http.ResponseWriter, r *http.Request) {
	var body ApproveBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	lc := agent.LifecycleSession
	switch body.Mode {
	case "once":
		lc = agent.LifecycleOnce
	case "session", "pattern":
	default:
		writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: mode %q: want once, session or pattern", agent.ErrInvalidRequest, body.Mode))
		return
	}
	s.syncCards()
	who := actor(r)
	s.cards.mu.Lock()
	defer s.cards.mu.Unlock()
	c, err := s.pendingCard(r.PathValue("id"))
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	results := make([]RequestResult, len(c.Items))
	for i, it := range c.Items {
		g, err := s.cfg.Agent.ApproveAs(r.Context(), it.Approval, who, lc)
		if err != nil {
			results[i] = RequestResult{Outcome: "denied", Reason: err.Error(), Status: statusFor(err)}
			continue
		}
		results[i] = RequestResult{Outcome: "granted", Grant: g, Status: http.StatusCreated}
		if body.Mode == "pattern" {
			s.cards.Patterns = append(s.cards.Patterns, Pattern{Card: c.ID, Session: c.Session, Scope: it.Scope, Decider: who})
		}
	}
	c.Status, c.Decision, c.Decider = "approved", body.Mode, who
	if err := s.cfg.Audit("card", map[string]any{"actor": who, "session": c.Session, "card": c.ID, "tier": c.Tier.String(), "outcome": "approved_" + body.Mode}); err != nil {
		s.cfg.Logger.Error("audit card", "err", err)
	}
	if err := s.cards.save(); err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	s.grantsChanged()
	s.cfg.Hub.Publish("api", "card.approved", c)
	writeJSON(w, http.StatusOK, map[string]any{"card": c, "results": results})
}

func (s *Server) denyCard(w http.ResponseWriter, r *http.Request)   { s.closeCard(w, r, "denied") }
func (s *Server) cancelCard(w http.ResponseWriter, r *http.Request) { s.closeCard(w, r, "cancelled") }

// closeCard records an explicit deny, or a dismissal (cancel) that is not a
// denial: the requests do not run either way.
func (s *Server) closeCard(w http.ResponseWriter, r *http.Request, status string) {
	s.syncCards()
	who := actor(r)
	s.cards.mu.Lock()
	defer s.cards.mu.Unlock()
	c, err := s.pendingCard(r.PathValue("id"))
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	var errs []error
	for _, it := range c.Items {
		var err error
		if status == "denied" {
			err = s.cfg.Agent.DenyApproval(r.Context(), it.Approval, who)
		} else {
			err = s.cfg.Agent.CancelApproval(it.Approval, who)
		}
		if err != nil && !errors.Is(err, agent.ErrUnknownApproval) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	c.Status, c.Decider = status, who
	if err := s.cfg.Audit("card", map[string]any{"actor": who, "session": c.Session, "card": c.ID, "tier": c.Tier.String(), "outcome": status}); err != nil {
		s.cfg.Logger.Error("audit card", "err", err)
	}
	if err := s.cards.save(); err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	s.cfg.Hub.Publish("api", "card."+status, c)
	writeJSON(w, http.StatusOK, c)
}

// ---- events, audit ----

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	if r.URL.Query().Get("follow") == "" {
		for _, rec := range s.cfg.Hub.Recent() {
			enc.Encode(rec)
		}
		return
	}
	ch, cancel := s.cfg.Hub.Subscribe()
	defer cancel()
	flusher, _ := w.(http.Flusher)
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case rec := <-ch:
			if err := enc.Encode(rec); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
	}
}

func (s *Server) verifyAudit(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Verify == nil {
		writeErr(w, http.StatusNotImplemented, errors.New("this agent keeps no audit log"))
		return
	}
	res, err := s.cfg.Verify()
	if err != nil {
		writeJSON(w, http.StatusConflict, map[string]any{"ok": false, "error": err.Error(), "result": res})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": res})
}

var _ io.Writer = (*capped)(nil)
