package api

// Files in and out of a session's workspace: PUT and GET
// /v1/sessions/{id}/files?path=PATH. The bytes stream through (no whole
// file is held in the agent) and the backend reads and writes them as the
// session, in its own view (backend.SessionFiles); each transfer is one
// file.put or file.get event in the agent's stream.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

// MaxFileBytes is the largest file PUT accepts (413 past it).
const MaxFileBytes = 16 << 30

// ErrNoWorkspace: the session was created without a workspace, so no
// file of the host is its to read or write.
var ErrNoWorkspace = errors.New("the session has no workspace")

// FileResult answers a PUT.
type FileResult struct {
	Path   string `json:"path"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

func (s *Server) fileRoutes(m *http.ServeMux) {
	m.HandleFunc("PUT /v1/sessions/{id}/files", s.putFile)
	m.HandleFunc("GET /v1/sessions/{id}/files", s.getFile)
}

// bodyLimit bounds a request's body: MaxFileBytes for a file upload, 1
// MiB for every other call.
func bodyLimit(r *http.Request) int64 {
	if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/sessions/") && strings.HasSuffix(r.URL.Path, "/files") {
		return MaxFileBytes
	}
	return 1 << 20
}

func fileStatus(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, backend.ErrFileOutside), errors.Is(err, backend.ErrFileDenied):
		return http.StatusForbidden
	case errors.Is(err, backend.ErrFileNotFound), errors.Is(err, ErrNoWorkspace):
		return http.StatusNotFound
	case errors.Is(err, backend.ErrFileNotRegular):
		return http.StatusBadRequest
	case errors.Is(err, backend.ErrFileTooLarge), errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, backend.ErrNotSupported):
		return http.StatusNotImplemented
	}
	return statusFor(err)
}

// WorkspacePath resolves a files API path against the workspace dir: an
// absolute path must lie strictly under dir, a relative one is taken from
// dir. It returns the absolute path and the part below dir. A path with a
// ".." component is refused whatever it names (backend.ErrFileOutside):
// the kernel resolves the rest beneath the workspace, with no symbolic
// link, again.
func WorkspacePath(dir, p string) (abs, rel string, err error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", "", fmt.Errorf("%w: path %q: a file's path in the workspace", agent.ErrInvalidRequest, p)
	}
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", "", fmt.Errorf("path %q: %w", p, backend.ErrFileOutside)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	abs = filepath.Clean(p)
	if abs == dir {
		return "", "", fmt.Errorf("%w: path %q is the workspace itself, not a file", agent.ErrInvalidRequest, p)
	}
	if !strings.HasPrefix(abs, dir+"/") {
		return "", "", fmt.Errorf("path %q is not in the workspace %s: %w", p, dir, backend.ErrFileOutside)
	}
	return abs, abs[len(dir)+1:], nil
}

// fileTarget finds the session's workspace, the backend's SessionFiles and
// the path asked; on a refusal it has answered.
func (s *Server) fileTarget(w http.ResponseWriter, r *http.Request, kind string) (sf backend.SessionFiles, id, dir, abs, rel string, ok bool) {
	id = r.PathValue("id")
	spec, found := s.cfg.Agent.Session(id)
	if !found {
		err := fmt.Errorf("%w: %q", agent.ErrUnknownSession, id)
		writeErr(w, statusFor(err), err)
		return
	}
	refuse := func(err error) {
		s.cfg.Agent.RecordFile(kind, id, actor(r), "refused", agent.FileTransfer{Path: r.URL.Query().Get("path"), Error: err.Error()})
		writeErr(w, fileStatus(err), err)
	}
	if spec.Mode == "" || spec.Workspace == "" {
		refuse(fmt.Errorf("session %s: %w (create it with a workspace and a mode)", id, ErrNoWorkspace))
		return
	}
	if sf, ok = s.cfg.Backend.(backend.SessionFiles); !ok {
		refuse(fmt.Errorf("%w: this backend moves no files in and out of sessions", backend.ErrNotSupported))
		return
	}
	var err error
	if abs, rel, err = WorkspacePath(spec.Workspace, r.URL.Query().Get("path")); err != nil {
		refuse(err)
		return sf, id, "", "", "", false
	}
	return sf, id, spec.Workspace, abs, rel, true
}

// putFile streams the body into the file (created or replaced whole; the
// directory must exist).
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) {
	sf, id, dir, abs, rel, ok := s.fileTarget(w, r, agent.EventFilePut)
	if !ok {
		return
	}
	who := actor(r)
	if r.ContentLength > MaxFileBytes {
		err := fmt.Errorf("%w: %d bytes announced (at most %d)", backend.ErrFileTooLarge, r.ContentLength, int64(MaxFileBytes))
		s.cfg.Agent.RecordFile(agent.EventFilePut, id, who, "refused", agent.FileTransfer{Path: abs, Error: err.Error()})
		writeErr(w, fileStatus(err), err)
		return
	}
	h := sha256.New()
	var sum string
	n, err := sf.WriteFile(id, dir, rel, io.TeeReader(r.Body, h), MaxFileBytes, func(n int64) error {
		sum = hex.EncodeToString(h.Sum(nil))
		return s.cfg.Agent.RecordFile(agent.EventFilePut, id, who, "ok", agent.FileTransfer{Path: abs, Bytes: n, SHA256: sum})
	})
	if err != nil {
		if sum == "" { // not recorded yet
			outcome := "failed"
			if c := fileStatus(err); c == http.StatusForbidden || c == http.StatusNotFound || c == http.StatusBadRequest || c == http.StatusRequestEntityTooLarge {
				outcome = "refused"
			}
			s.cfg.Agent.RecordFile(agent.EventFilePut, id, who, outcome, agent.FileTransfer{Path: abs, Bytes: n, Error: err.Error()})
		}
		writeErr(w, fileStatus(err), err)
		return
	}
	writeJSON(w, http.StatusCreated, FileResult{Path: abs, Bytes: n, SHA256: sum})
}

// getFile streams the file out (Content-Length: its size when opened).
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	sf, id, dir, abs, rel, ok := s.fileTarget(w, r, agent.EventFileGet)
	if !ok {
		return
	}
	who := actor(r)
	f, err := sf.OpenFile(id, dir, rel)
	if err != nil {
		s.cfg.Agent.RecordFile(agent.EventFileGet, id, who, "refused", agent.FileTransfer{Path: abs, Error: err.Error()})
		writeErr(w, fileStatus(err), err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
	w.WriteHeader(http.StatusOK)
	h := sha256.New()
	// At most the size announced: a file that grows while it is sent is
	// cut there; one that shrinks ends the response short (the client
	// sees fewer bytes than Content-Length).
	n, err := io.Copy(w, io.TeeReader(io.LimitReader(f, st.Size()), h))
	t := agent.FileTransfer{Path: abs, Bytes: n}
	outcome := "ok"
	if err != nil || n != st.Size() {
		outcome, t.Error = "failed", fmt.Sprintf("sent %d of %d bytes: %v", n, st.Size(), err)
	} else {
		t.SHA256 = hex.EncodeToString(h.Sum(nil))
	}
	s.cfg.Agent.RecordFile(agent.EventFileGet, id, who, outcome, t)
}
