package api

// POST /v1/decide: the use-time decision of one request, with the rule that
// decided. POST /v1/policies: a policy change through the permissiveness
// gate (diff, or apply).

import (
	"errors"
	"net/http"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	var body DecideBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	start := time.Now()
	d, err := s.cfg.Agent.DecideUse(body.Session, body.Request)
	s.cfg.ObserveDecision(time.Since(start))
	if err != nil {
		code := statusFor(err)
		if errors.Is(err, agent.ErrInvalidCapability) {
			code = http.StatusBadRequest
		}
		writeErr(w, code, err)
		return
	}
	writeCompact(w, http.StatusOK, d)
}

func (s *Server) policies(w http.ResponseWriter, r *http.Request) {
	var body PolicyBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	c := agent.PolicyChange{Files: body.Files, AllowWidening: body.AllowWidening, Actor: actor(r)}
	var rep *agent.PolicyReport
	var err error
	if body.Apply {
		rep, err = s.cfg.Agent.ApplyPolicies(c)
	} else {
		rep, err = s.cfg.Agent.PolicyDiff(c)
	}
	switch {
	case err != nil && rep != nil: // refused by the gate: the report says why
		writeJSON(w, http.StatusConflict, PolicyResult{PolicyReport: rep, Error: err.Error()})
	case errors.Is(err, agent.ErrPolicy), errors.Is(err, agent.ErrInvalidRequest):
		writeErr(w, http.StatusBadRequest, err)
	case errors.Is(err, agent.ErrNoPolicyDir):
		writeErr(w, http.StatusConflict, err)
	case err != nil:
		writeErr(w, statusFor(err), err)
	default:
		writeJSON(w, http.StatusOK, PolicyResult{PolicyReport: rep})
	}
}
