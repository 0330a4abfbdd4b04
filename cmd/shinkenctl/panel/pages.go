package panel

import (
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/capability"
)

//go:embed assets
var assets embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"scope": capability.Capability.Summary,
	"until": until,
	"json": func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	},
}).ParseFS(assets, "assets/*.html"))

func (s *Server) routes() {
	static, _ := fs.Sub(assets, "assets/static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.sessionsPage)
	s.mux.HandleFunc("GET /grants", s.grantsPage)
	s.mux.HandleFunc("GET /cards", s.cardsPage)
	s.mux.HandleFunc("GET /events", s.eventsPage)
	s.mux.HandleFunc("GET /events/stream", s.eventStream)
	s.mux.HandleFunc("GET /enforcement", s.enforcementPage)
	s.mux.HandleFunc("GET /audit", s.auditPage)
	s.mux.HandleFunc("POST /api/revoke", s.revoke)
	s.mux.HandleFunc("POST /api/cards/{id}/{action}", s.decideCard)
	s.terminalRoutes() // terminal.go
}

// page is what every template gets.
type page struct {
	Title string
	Nav   string
	CSRF  string
	Error string
	Flow  string // the backend's flow mode, shown in the header
	Data  any
}

func (s *Server) render(w http.ResponseWriter, nav, title string, data any, err error) {
	p := page{Title: title, Nav: nav, CSRF: s.csrf, Data: data}
	if err != nil {
		p.Error = err.Error()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pages.ExecuteTemplate(w, nav+".html", p); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// sessionRow is one session with the enforcement levels of what it holds.
type sessionRow struct {
	session
	UIDText string
	Live    int
	Levels  []string
}

func (s *Server) sessionsPage(w http.ResponseWriter, r *http.Request) {
	ss, err := s.agent.sessions(r.Context())
	var gs []capability.GrantInfo
	var st status
	if err == nil {
		gs, err = s.agent.grants(r.Context())
	}
	if err == nil {
		st, err = s.agent.status()
	}
	level := map[capability.Class]string{}
	for _, e := range st.Enforcement {
		level[e.Class] = string(e.Level)
	}
	var rows []sessionRow
	for _, sv := range ss {
		row := sessionRow{session: sv, UIDText: "?"}
		if sv.UID != nil {
			row.UIDText = fmt.Sprint(*sv.UID)
		}
		classes := map[capability.Class]bool{}
		for _, g := range gs {
			if g.Session == sv.ID && g.Phase == capability.PhaseLive {
				row.Live++
				classes[g.Capability.Class] = true
			}
		}
		for c := range classes {
			row.Levels = append(row.Levels, fmt.Sprintf("%s: %s", c, level[c]))
		}
		sort.Strings(row.Levels)
		rows = append(rows, row)
	}
	s.render(w, "sessions", "Sessions", struct {
		Rows []sessionRow
		Flow string
	}{rows, st.Backend.Facts["flow_mode"]}, err)
}

// node is a grant in the handle tree: attenuated children under parents.
type node struct {
	G        capability.GrantInfo
	Children []*node
}

// grantTree groups the grants that are not tombstones by session, each
// session's grants as a forest (a child whose parent is gone is a root).
func grantTree(gs []capability.GrantInfo) map[string][]*node {
	byID := map[string]*node{}
	var order []*node
	for _, g := range gs {
		if g.Phase.Terminal() {
			continue
		}
		n := &node{G: g}
		byID[g.ID] = n
		order = append(order, n)
	}
	out := map[string][]*node{}
	for _, n := range order {
		if p, ok := byID[n.G.Parent]; ok && n.G.Parent != "" {
			p.Children = append(p.Children, n)
			continue
		}
		out[n.G.Session] = append(out[n.G.Session], n)
	}
	return out
}

type sessionTree struct {
	Session string
	Roots   []*node
	Files   []fileRow
}

// fileRow is one path of a session's file grant (fs.scope, persistence):
// what it gives there, the grant whose switch revokes it, and whether an
// admin policy permits it (an override: it opens a credential location it
// names).
type fileRow struct {
	Path, Access string
	G            capability.GrantInfo
	Override     bool
}

// fileRows lists the paths of session's file grants that are not
// tombstones, by path.
func fileRows(gs []capability.GrantInfo, session string) []fileRow {
	var out []fileRow
	for _, g := range gs {
		if g.Session != session || g.Phase.Terminal() {
			continue
		}
		add := func(access string, paths []string) {
			for _, p := range paths {
				out = append(out, fileRow{Path: p, Access: access, G: g, Override: slices.Contains(g.Overrides, p)})
			}
		}
		if fs := g.Capability.FS; fs != nil {
			add("read", fs.Read)
			add("write", fs.Write)
			add("delete", fs.Delete)
			add("deny", fs.Deny)
			add("connect", fs.Connect)
		}
		if p := g.Capability.Persistence; p != nil {
			a := "persist (this session)"
			if p.SurvivesSession {
				a = "persist (survives the session)"
			}
			add(a, p.Paths)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func (s *Server) grantsPage(w http.ResponseWriter, r *http.Request) {
	gs, err := s.agent.grants(r.Context())
	tree := grantTree(gs)
	var out []sessionTree
	for sess, roots := range tree {
		out = append(out, sessionTree{sess, roots, fileRows(gs, sess)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Session < out[j].Session })
	s.render(w, "grants", "Live grants", out, err)
}

func (s *Server) cardsPage(w http.ResponseWriter, r *http.Request) {
	cs, err := s.agent.cards(r.Context())
	s.render(w, "cards", "Pending cards", cs, err)
}

// denialRow is one denial as the page shows it: who, why, and the rest.
type denialRow struct {
	wire.Record
	Session, Reason, Detail string
}

// summarize picks the session and the reason out of a record's data (kernel,
// DNS and agent records name them differently) and lists the other fields.
// panel.js does the same for the live rows.
func summarize(rec wire.Record) denialRow {
	row := denialRow{Record: rec}
	var m map[string]any
	if json.Unmarshal(rec.Data, &m) != nil {
		row.Detail = string(rec.Data)
		return row
	}
	var rest []string
	for k, v := range m {
		val, ok := v.(string)
		if !ok {
			b, _ := json.Marshal(v)
			val = string(b)
		}
		switch strings.ToLower(k) {
		case "session":
			row.Session = val
		case "reason":
			row.Reason = val
		case "time":
		default:
			if val != "" && val != "0" {
				rest = append(rest, strings.ToLower(k)+"="+val)
			}
		}
	}
	sort.Strings(rest)
	row.Detail = strings.Join(rest, " ")
	return row
}

func (s *Server) eventsPage(w http.ResponseWriter, r *http.Request) {
	rs, err := s.agent.recent(r.Context())
	var den []denialRow
	for _, rec := range rs {
		if isDenial(rec) {
			den = append(den, summarize(rec))
		}
	}
	// Newest first, as the live stream prepends.
	for i, j := 0, len(den)-1; i < j; i, j = i+1, j-1 {
		den[i], den[j] = den[j], den[i]
	}
	s.render(w, "events", "Denials", den, err)
}

func isDenial(r wire.Record) bool {
	return strings.HasSuffix(r.Kind, "deny") || strings.HasSuffix(r.Kind, ".denied")
}

// eventStream relays the agent's event stream (GET /v1/events?follow=1) as
// server-sent events: denials only, or everything with ?all=1.
func (s *Server) eventStream(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	all := r.URL.Query().Get("all") != ""
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": shinken denial stream\n\n")
	fl.Flush()
	err := s.agent.stream(r.Context(), "/v1/events?follow=1", func(rec wire.Record, line []byte) error {
		if !all && !isDenial(rec) {
			return nil
		}
		if _, err := fmt.Fprintf(w, "event: record\ndata: %s\n\n", line); err != nil {
			return err
		}
		fl.Flush()
		return nil
	})
	if err != nil && r.Context().Err() == nil {
		fmt.Fprintf(w, "event: failure\ndata: %s\n\n", jsonString(err.Error()))
		fl.Flush()
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func (s *Server) enforcementPage(w http.ResponseWriter, r *http.Request) {
	st, err := s.agent.status()
	keys := make([]string, 0, len(st.Backend.Facts))
	for k := range st.Backend.Facts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s.render(w, "enforcement", "Enforcement", struct {
		St        status
		FactKeys  []string
		OtherJSON string
	}{st, keys, indentJSON(st.Other)}, err)
}

func (s *Server) auditPage(w http.ResponseWriter, r *http.Request) {
	v, err := s.agent.verify(r.Context())
	s.render(w, "audit", "Audit log", struct {
		V      verifyResult
		Result string
	}{v, indentJSON(v.Result)}, err)
}

func indentJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// ---- actions (POST, behind the origin and anti-forgery checks) ----

func answer(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code := http.StatusBadGateway
		if ae, ok := err.(*apiError); ok {
			code = ae.Status
		}
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	json.NewEncoder(w).Encode(v)
}

func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	var body struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.ID == "" {
		answer(w, nil, &apiError{http.StatusBadRequest, "want {\"id\": GRANT}"})
		return
	}
	var res any
	err := s.agent.call(r.Context(), "POST", "/v1/grants/revoke", wire.RevokeBody{ID: body.ID}, &res)
	answer(w, res, err)
}

func (s *Server) decideCard(w http.ResponseWriter, r *http.Request) {
	id, action := r.PathValue("id"), r.PathValue("action")
	if strings.ContainsAny(id, "/?#%") || id == "" {
		answer(w, nil, &apiError{http.StatusBadRequest, "bad card id"})
		return
	}
	var res any
	var err error
	switch action {
	case "approve-once", "approve-session", "approve-pattern":
		err = s.agent.call(r.Context(), "POST", "/v1/cards/"+id+"/approve", wire.ApproveBody{Mode: strings.TrimPrefix(action, "approve-")}, &res)
	case "deny":
		err = s.agent.call(r.Context(), "POST", "/v1/cards/"+id+"/deny", nil, &res)
	default:
		err = &apiError{http.StatusBadRequest, "action: want approve-once, approve-session, approve-pattern or deny"}
	}
	answer(w, res, err)
}

// ---- formatting ----

func until(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Until(t).Round(time.Second)
	if d < 0 {
		return "expired"
	}
	return d.String()
}
