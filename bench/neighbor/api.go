//go:build linux

package main

// The bench's calls to the agent's API (its Unix socket).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/capability"
)

type client struct{ hc *http.Client }

// call sends body (nil: no body) and decodes a 2xx answer into out; it
// returns the status, the raw answer and the time to its last byte.
func (c *client) call(method, path string, body, out any) (int, []byte, time.Duration, error) {
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return 0, nil, 0, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, "http://shinken"+path, rd)
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	msg, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(t0)
	if err != nil {
		return resp.StatusCode, msg, took, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(msg, out); err != nil {
			return resp.StatusCode, msg, took, fmt.Errorf("%s: %v: %s", path, err, msg)
		}
	}
	return resp.StatusCode, msg, took, nil
}

// request asks for one capability for session s; a pending card is
// approved for the session. It returns the grant's handle and the time
// of the request alone.
func (c *client) request(s string, cp capability.Capability) (string, time.Duration, error) {
	req := capability.GrantRequest{Session: s, Lifecycle: capability.LifecycleSession, Capability: cp}
	var res []wire.RequestResult
	code, msg, took, err := c.call("POST", "/v1/requests", wire.RequestBody{Requests: []capability.GrantRequest{req}}, &res)
	if err != nil {
		return "", 0, err
	}
	if len(res) != 1 {
		return "", 0, fmt.Errorf("request for %s: HTTP %d: %s", s, code, msg)
	}
	switch {
	case res[0].Outcome == "granted" && res[0].Grant != nil:
		return res[0].Grant.Handle, took, nil
	case res[0].Outcome == "pending" && res[0].Card != "":
		var g json.RawMessage
		code, msg, _, err := c.call("POST", "/v1/cards/"+res[0].Card+"/approve", wire.ApproveBody{Mode: "session"}, &g)
		if err != nil || code/100 != 2 {
			return "", 0, fmt.Errorf("approve %s: HTTP %d %v: %s", res[0].Card, code, err, msg)
		}
		return "", took, nil
	}
	return "", 0, fmt.Errorf("request for %s: HTTP %d: %s", s, code, msg)
}

// grantOne asks for net.egress to addr:443 for s (the loopback Auto tier:
// Cedar, the proof, the journal, the kernel handle and rule, the audit
// records), as `shinkenctl request s net.egress -cidr addr/32 -port 443`.
func (c *client) grantOne(s string, addr netip.Addr) (string, time.Duration, error) {
	h, took, err := c.request(s, capability.Capability{Class: capability.ClassNetEgress,
		Egress: &capability.EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(addr, 32)}, Ports: []capability.PortRange{{Lo: 443, Hi: 443}}}})
	if err == nil && h == "" {
		err = fmt.Errorf("grant %s/32 to %s: not granted at once (want the Auto tier)", addr, s)
	}
	return h, took, err
}

func (c *client) revoke(h string) error {
	var g json.RawMessage
	code, msg, _, err := c.call("POST", "/v1/grants/revoke", wire.RevokeBody{Handle: h}, &g)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("revoke %s: HTTP %d: %s", h, code, msg)
	}
	return err
}

// run runs argv in session s to its end and returns its stdout.
func (c *client) run(s string, timeout time.Duration, argv ...string) (string, error) {
	var res wire.RunResult
	code, msg, _, err := c.call("POST", "/v1/sessions/"+s+"/run", wire.RunRequest{Argv: argv, TimeoutS: timeout.Seconds()}, &res)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", &notRunError{fmt.Sprintf("run in %s: HTTP %d: %s", s, code, msg)}
	}
	if res.ExitCode != 0 || res.Truncated || res.Running {
		return "", fmt.Errorf("run in %s: exit %d, truncated %v, running %v: %s %s", s, res.ExitCode, res.Truncated, res.Running, res.Stderr, msg)
	}
	return res.Stdout, nil
}

// notRunError: the agent answered a run with an error of its own (the
// process did not start, or was not waited for), not with the process's
// result.
type notRunError struct{ msg string }

func (e *notRunError) Error() string { return e.msg }

// start starts argv in session s and returns its process id.
func (c *client) start(s string, deadline time.Duration, argv ...string) (string, error) {
	var p wire.Process
	code, msg, _, err := c.call("POST", "/v1/sessions/"+s+"/processes", wire.ProcessStart{Argv: argv, DeadlineS: deadline.Seconds()}, &p)
	if err != nil {
		return "", err
	}
	if code != http.StatusCreated {
		return "", fmt.Errorf("start in %s: HTTP %d: %s", s, code, msg)
	}
	return p.ID, nil
}

func (c *client) process(s, id string) (wire.Process, error) {
	var p wire.Process
	code, msg, _, err := c.call("GET", "/v1/sessions/"+s+"/processes/"+id, nil, &p)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("process %s: HTTP %d: %s", id, code, msg)
	}
	return p, err
}

func (c *client) logs(s, id string) (string, error) {
	code, msg, _, err := c.call("GET", "/v1/sessions/"+s+"/processes/"+id+"/logs?stream=stdout&from=0", nil, nil)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("logs of %s: HTTP %d: %s", id, code, msg)
	}
	return string(msg), err
}

// finish waits until the process has printed "done" (or ended), kills its
// tree and returns its stdout.
func (c *client) finish(s, id string, wait time.Duration) (string, error) {
	end := time.Now().Add(wait)
	for {
		p, err := c.process(s, id)
		if err != nil {
			return "", err
		}
		out, err := c.logs(s, id)
		if err != nil {
			return "", err
		}
		if p.State != wire.ProcRunning || strings.Contains(out, "done 1") || time.Now().After(end) {
			if p.State == wire.ProcRunning {
				if code, msg, _, err := c.call("DELETE", "/v1/sessions/"+s+"/processes/"+id, nil, nil); err != nil || code/100 != 2 {
					return out, fmt.Errorf("kill %s: HTTP %d %v: %s", id, code, err, msg)
				}
			}
			if !strings.Contains(out, "done 1") {
				return out, fmt.Errorf("flood process %s (%s, exit %v): no result: %s", id, p.State, p.ExitCode, out)
			}
			return out, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}
