package api

// GET /debug/pprof/...: the runtime's profiles, for an operator who turned
// them on (the daemon's debug_pprof, off by default). Root only, whatever
// the operator group: a profile shows the daemon's memory (session ids,
// policy, handles' ids in strings it holds).

import (
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strconv"
	"time"
)

var errNotRoot = errors.New("permission denied: /debug/pprof is for root only")

// debugRoutes serves the profiles of runtime/pprof by name
// (/debug/pprof/heap, goroutine, allocs, block, mutex, threadcreate;
// ?debug=1 for text, ?gc=1 to collect before a heap profile) and a CPU
// profile (/debug/pprof/profile?seconds=N, 1 to 60, default 10). It does not
// use net/http/pprof, whose import registers the handlers on
// http.DefaultServeMux.
func (s *Server) debugRoutes(m *http.ServeMux) {
	m.HandleFunc("GET /debug/pprof/profile", s.rootOnly(cpuProfile))
	m.HandleFunc("GET /debug/pprof/{name}", s.rootOnly(namedProfile))
}

func (s *Server) rootOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c, ok := CredsFrom(r.Context()); !ok || c.UID != 0 {
			writeErr(w, http.StatusForbidden, errNotRoot)
			return
		}
		h(w, r)
	}
}

func namedProfile(w http.ResponseWriter, r *http.Request) {
	p := pprof.Lookup(r.PathValue("name"))
	if p == nil {
		writeErr(w, http.StatusNotFound, fmt.Errorf("no profile %q", r.PathValue("name")))
		return
	}
	dbg, _ := strconv.Atoi(r.URL.Query().Get("debug"))
	if p.Name() == "heap" && r.URL.Query().Get("gc") != "" {
		runtime.GC()
	}
	if dbg == 0 {
		w.Header().Set("Content-Type", "application/octet-stream")
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	p.WriteTo(w, dbg)
}

func cpuProfile(w http.ResponseWriter, r *http.Request) {
	secs := 10
	if v := r.URL.Query().Get("seconds"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 60 {
			writeErr(w, http.StatusBadRequest, fmt.Errorf("seconds %q: want 1 to 60", v))
			return
		}
		secs = n
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if err := pprof.StartCPUProfile(w); err != nil {
		writeErr(w, http.StatusConflict, err) // another profile is running
		return
	}
	select {
	case <-time.After(time.Duration(secs) * time.Second):
	case <-r.Context().Done():
	}
	pprof.StopCPUProfile()
}
