package api

// Requests, grants, revoke and attenuate over HTTP: decode, call the agent,
// encode. The agent decides, batches Asks into cards and applies patterns.

import (
	"fmt"
	"net/http"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

// ---- requests, grants ----

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
	for i := range body.Requests {
		req := &body.Requests[i]
		if req.Requester == "" {
			req.Requester = who
		}
		if err := s.cfg.Audit("request", map[string]any{"actor": who, "agent": req.Requester, "session": req.Session,
			"resource": string(req.Capability.Class), "params": req.Capability, "provenance": string(req.Provenance),
			"lifetime": string(req.Lifecycle), "parent": req.Parent}); err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
	}
	res, err := s.cfg.Agent.Request(r.Context(), body.Requests)
	for _, o := range res {
		s.cfg.ObserveDecision(o.Took)
	}
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	results := make([]RequestResult, len(res))
	for i, o := range res {
		results[i] = resultOf(o)
	}
	code := http.StatusOK
	if len(results) == 1 {
		code = results[0].Status
	}
	writeJSON(w, code, results)
}

// resultOf encodes the agent's outcome of one request with its HTTP status.
func resultOf(o agent.RequestResult) RequestResult {
	switch o.Outcome {
	case "granted":
		return RequestResult{Outcome: "granted", Grant: o.Grant, Reason: o.Reason, Status: http.StatusCreated}
	case "pending":
		return RequestResult{Outcome: "pending", Card: o.Card, Reason: o.Reason, Status: http.StatusAccepted}
	}
	out, code := "denied", statusFor(o.Err)
	if code == http.StatusBadRequest && o.Pattern == "" { // a request the gate found malformed
		out = "invalid"
	}
	return RequestResult{Outcome: out, Reason: o.Reason, Status: code}
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
	writeJSON(w, http.StatusOK, map[string]string{"revoked": body.Handle + body.ID})
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
	writeJSON(w, http.StatusCreated, g)
}
