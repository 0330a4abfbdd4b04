package api

// Sessions over HTTP: create (quotas the host cannot enforce are refused
// first), list, show, delete, and run a command inside a session.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

// MaxRunOutput caps what /run returns of a command's stdout and stderr each.
const MaxRunOutput = 1 << 20

// ---- sessions ----

func (s *Server) view(spec agent.SessionSpec, detail bool) SessionView {
	v := SessionView{SessionSpec: spec}
	if ks, err := s.cfg.Backend.Session(spec.ID); err == nil {
		v.Index, v.CgroupID, v.Path = ks.Index, ks.CgroupID, ks.Path
		if b, ok := s.cfg.Backend.(backend.SessionIdentity); ok {
			if uid, err := b.SessionUID(spec.ID); err == nil {
				v.UID = &uid
			}
		}
		if b, ok := s.cfg.Backend.(backend.SessionHolders); ok {
			if run, err := b.HolderRunning(spec.ID); err == nil {
				v.Holder = &run
			}
		}
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
		v.Paused, v.PausedSince = s.cfg.Agent.Paused(spec.ID)
	} else {
		v.Paused, v.PausedSince = s.cfg.Agent.PausedKnown(spec.ID)
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

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var body CreateSessionBody
	if err := decode(r, &body); err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	spec := body
	if err := s.cfg.Agent.CreateSession(spec); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	if sp, ok := s.cfg.Agent.Session(spec.ID); ok {
		writeJSON(w, http.StatusCreated, s.view(sp, false))
		return
	}
	writeErr(w, http.StatusInternalServerError, errors.New("session vanished after create"))
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	specs := s.cfg.Agent.Sessions()
	writeJSONArray(w, http.StatusOK, len(specs), func(i int) any { return s.view(specs[i], false) })
}

func (s *Server) find(id string) (agent.SessionSpec, error) {
	if sp, ok := s.cfg.Agent.Session(id); ok {
		return sp, nil
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
	// Straight to the agent: a removal that failed half way (the session
	// is ending) is finished by the same call again.
	id := r.PathValue("id")
	if err := s.cfg.Agent.EndSession(id); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	if s.cfg.Processes != nil { // killed with the session: their records go
		s.cfg.Processes.Remove(id)
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": id})
}

// forgetPersisted removes what sessions of a name kept (persistence with
// survives_session); refused while the session exists.
func (s *Server) forgetPersisted(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.cfg.Agent.ForgetPersisted(id); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"forgotten": id})
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
	if s.cfg.Processes != nil {
		s.runProcess(w, r, s.cfg.Processes)
		return
	}
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
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, req.Argv[0], req.Argv[1:]...)
	cmd.Env = backend.DefaultEnv(id)
	var stdout, stderr capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = strings.NewReader(req.Stdin)
	if err := s.cfg.Agent.Launch(id, cmd, backend.LaunchOptions{UID: req.UID, GID: req.GID}, actor(r)); err != nil {
		writeErr(w, statusFor(err), err)
		return
	}
	err := cmd.Wait()
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

var _ io.Writer = (*capped)(nil)
