package api

// Approval cards over HTTP: list, show, approve (once, session, pattern),
// deny, cancel. The cards and their store are the agent's (agent/cards.go).

import (
	"net/http"

	"github.com/shinken-agent/shinken/agent"
)

// ---- cards ----

// Card and CardItem are the wire form of the agent's approval cards.
type (
	Card     = agent.Card
	CardItem = agent.CardItem
)

func (s *Server) listCards(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.cfg.Agent.Cards(r.URL.Query().Get("all") != ""))
}

func (s *Server) showCard(w http.ResponseWriter, r *http.Request) {
	c, err := s.cfg.Agent.Card(r.PathValue("id"))
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) approveCard(w http.ResponseWriter, r *http.Request) {
	var body ApproveBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	who := actor(r)
	c, res, err := s.cfg.Agent.ApproveCard(r.Context(), r.PathValue("id"), body.Mode, who)
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	results := make([]RequestResult, len(res))
	for i, o := range res {
		results[i] = resultOf(o)
		results[i].Outcome = o.Outcome // a card item is granted or denied, never "invalid"
	}
	writeJSON(w, http.StatusOK, map[string]any{"card": c, "results": results})
}

// denyCard records an explicit deny, cancelCard a dismissal that is not a
// denial: the requests do not run either way.
func (s *Server) denyCard(w http.ResponseWriter, r *http.Request) {
	who := actor(r)
	c, err := s.cfg.Agent.DenyCard(r.Context(), r.PathValue("id"), who)
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) cancelCard(w http.ResponseWriter, r *http.Request) {
	who := actor(r)
	c, err := s.cfg.Agent.CancelCard(r.Context(), r.PathValue("id"), who)
	if err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}
