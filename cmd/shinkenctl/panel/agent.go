package panel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// callTimeout bounds one API call (a run may take long; the panel makes none).
const callTimeout = 30 * time.Second

// agentClient is the panel's side of the agent's Unix-socket API, using the
// API's own request and response types.
type agentClient struct {
	hc    *http.Client
	actor string
}

// apiError is an answer outside 2xx, with the agent's reason.
type apiError struct {
	Status int
	Msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Status) }

// call sends body (JSON) and decodes a 2xx answer into out. A non-2xx
// answer is an *apiError; its body is still decoded into out when possible.
func (c *agentClient) call(ctx context.Context, method, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://shinken"+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-Shinken-Actor", c.actor)
	resp, err := c.hc.Do(req)
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) {
			return fmt.Errorf("cannot reach the agent: %w (is shinken-agent running, and are you root or in the operator group?)", ne.Err)
		}
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		if out != nil {
			json.Unmarshal(data, out)
		}
		var e wire.Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return &apiError{resp.StatusCode, e.Error}
		}
		return &apiError{resp.StatusCode, strings.TrimSpace(string(data))}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode %s: %w", path, err)
		}
	}
	return nil
}

// status is GET /v1/status: the per-class report, the backend's report and
// the remaining daemon facts.
type status struct {
	Enforcement []capability.Enforcement `json:"enforcement"`
	Backend     backend.Report           `json:"backend"`
	Other       map[string]any           `json:"-"`
}

func (c *agentClient) status() (status, error) {
	var raw map[string]json.RawMessage
	var st status
	if err := c.call(context.Background(), "GET", "/v1/status", nil, &raw); err != nil {
		return st, err
	}
	st.Other = map[string]any{}
	for k, v := range raw {
		var err error
		switch k {
		case "enforcement":
			err = json.Unmarshal(v, &st.Enforcement)
		case "backend":
			err = json.Unmarshal(v, &st.Backend)
		default:
			var x any
			err = json.Unmarshal(v, &x)
			st.Other[k] = x
		}
		if err != nil {
			return st, fmt.Errorf("decode status %s: %w", k, err)
		}
	}
	return st, nil
}

// session is a session as the API lists it (UID: nil when the backend
// does not say).
type session struct {
	wire.SessionView
}

func (c *agentClient) sessions(ctx context.Context) ([]session, error) {
	var out []session
	err := c.call(ctx, "GET", "/v1/sessions", nil, &out)
	return out, err
}

func (c *agentClient) grants(ctx context.Context) ([]capability.GrantInfo, error) {
	var out []capability.GrantInfo
	err := c.call(ctx, "GET", "/v1/grants", nil, &out)
	return out, err
}

func (c *agentClient) cards(ctx context.Context) ([]capability.Card, error) {
	var out []capability.Card
	err := c.call(ctx, "GET", "/v1/cards", nil, &out)
	return out, err
}

// verify is GET /v1/audit/verify; a failed verification is a result, not an
// error (the agent answers 409 with the problems).
type verifyResult struct {
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Result any    `json:"result"`
}

func (c *agentClient) verify(ctx context.Context) (verifyResult, error) {
	var v verifyResult
	err := c.call(ctx, "GET", "/v1/audit/verify", nil, &v)
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusConflict {
		return v, nil
	}
	return v, err
}

// recent returns the events the agent keeps (oldest first).
func (c *agentClient) recent(ctx context.Context) ([]wire.Record, error) {
	var out []wire.Record
	err := c.stream(ctx, "/v1/events", func(r wire.Record, _ []byte) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// stream reads the agent's NDJSON event stream at path, calling fn per line
// until the stream or ctx ends.
func (c *agentClient) stream(ctx context.Context, path string, fn func(wire.Record, []byte) error) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://shinken"+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Shinken-Actor", c.actor)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the agent: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &apiError{resp.StatusCode, strings.TrimSpace(string(b))}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		var r wire.Record
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		if err := fn(r, sc.Bytes()); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}
