package api

// The event stream (NDJSON, recent or followed) and audit-log verification.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

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
			if err := enc.Encode(rec.encoded()); err != nil {
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
	full := false
	switch v := r.URL.Query().Get("full"); v {
	case "", "0", "false":
	case "1", "true":
		full = true
	default:
		writeErr(w, http.StatusBadRequest, fmt.Errorf("full=%q: want 1, true, 0 or false", v))
		return
	}
	res, err := s.cfg.Verify(full)
	if err != nil {
		writeJSON(w, http.StatusConflict, map[string]any{"ok": false, "error": err.Error(), "result": res})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": res})
}
