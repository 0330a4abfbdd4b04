package api

// Requests, grants, revoke and attenuate over HTTP: decode, call the agent,
// encode. The agent decides, batches Asks into cards and applies patterns.

import (
	"fmt"
	"net/http"

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
		if body.Requests[i].Requester == "" {
			body.Requests[i].Requester = who
		}
	}
	res, err := s.cfg.Agent.Request(agent.WithActor(r.Context(), who), body.Requests)
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
	g, err := s.cfg.Agent.Attenuate(agent.WithActor(r.Context(), actor(r)), body.Parent, body.Request)
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	writeJSON(w, http.StatusCreated, g)
}
