//go:build linux

package main

// The grant phase (grant_p99_ms): with every session live, N net.egress
// grants are asked for one at a time through the API, exactly as
// `shinkenctl request SESSION net.egress -cidr A/32 -port 443` asks
// (POST /v1/requests, one GrantRequest), each to another session and
// another /32 inside the manifest's 127.0.0.0/8, so that each is a new
// Auto-tier grant (Cedar, the proof, the journal, the kernel handle and
// rule, the audit records). They are revoked afterwards, untimed.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
)

// grantWarmup grants are asked for and revoked first, untimed.
const grantWarmup = 5

// grantAddr is the i-th bench address: 127.1.0.0 + i + 1, a /32 of its own
// (outside the sessions' resolver range 127.128.0.0/9).
func grantAddr(i int) netip.Addr {
	n := i + 1
	return netip.AddrFrom4([4]byte{127, byte(1 + n>>16), byte(n >> 8), byte(n)})
}

// post sends body as JSON and decodes the answer into out; it returns the
// HTTP status and the time from the request's start to the answer's last
// byte read (decoding untimed).
func post(hc *http.Client, path string, body, out any) (int, time.Duration, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	resp, err := hc.Post("http://shinken"+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, 0, err
	}
	msg, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(t0)
	if err != nil {
		return resp.StatusCode, took, err
	}
	if out != nil {
		if err := json.Unmarshal(msg, out); err != nil {
			return resp.StatusCode, took, fmt.Errorf("%s: HTTP %d: %v: %s", path, resp.StatusCode, err, msg)
		}
	}
	return resp.StatusCode, took, nil
}

// grantOne asks for net.egress to addr:443 for session s<session>; it
// returns the grant's handle and the time the exchange took.
func grantOne(hc *http.Client, session int, addr netip.Addr) (string, time.Duration, error) {
	id := fmt.Sprintf("s%d", session)
	req := agent.GrantRequest{Session: id, Lifecycle: agent.LifecycleSession, Capability: agent.Capability{
		Class:  agent.ClassNetEgress,
		Egress: &agent.EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(addr, 32)}, Ports: []agent.PortRange{{Lo: 443, Hi: 443}}},
	}}
	var res []api.RequestResult
	code, took, err := post(hc, "/v1/requests", api.RequestBody{Requests: []agent.GrantRequest{req}}, &res)
	if err != nil {
		return "", 0, err
	}
	if len(res) != 1 || res[0].Outcome != "granted" || res[0].Grant == nil || code != http.StatusCreated {
		return "", 0, fmt.Errorf("grant net.egress %s:443 to %s: HTTP %d: %+v (want granted at the Auto tier)", addr, id, code, res)
	}
	return res[0].Grant.Handle, took, nil
}

// revokeAll revokes the grants by handle, one at a time, and returns each
// revoke's time (ms) from the request's start to its answer's last byte.
func revokeAll(hc *http.Client, handles []string) ([]float64, error) {
	var times []float64
	for _, h := range handles {
		var g json.RawMessage
		t0 := time.Now()
		code, _, err := post(hc, "/v1/grants/revoke", api.RevokeBody{Handle: h}, &g)
		took := time.Since(t0)
		if err != nil {
			return times, err
		}
		if code != http.StatusOK {
			return times, fmt.Errorf("revoke %s: HTTP %d: %s", h, code, g)
		}
		times = append(times, float64(took.Nanoseconds())/1e6)
	}
	return times, nil
}

// timeGrants times n grants one at a time, spread over the sessions
// (every sessions/n-th one), after grantWarmup untimed ones; it checks one
// with a use-time decision, then revokes them all. With fl, each timed
// grant is followed by the same request to the floor (floor.go), timed
// too. The revokes are timed (revokes: all of them, warm-up included; see
// revokeAll). Times in ms.
func timeGrants(hc *http.Client, sessions, n int, fl *floor) (times, floors, revokes []float64, _ error) {
	total := n + grantWarmup
	step := max(1, sessions/total)
	var handles []string
	defer func() { revokeAll(hc, handles) }() //nolint:errcheck // on an error: what was granted is revoked
	for i := 0; i < total; i++ {
		h, took, err := grantOne(hc, (i*step)%sessions, grantAddr(i))
		if err != nil {
			return nil, nil, nil, err
		}
		handles = append(handles, h)
		if i < grantWarmup {
			continue
		}
		times = append(times, float64(took.Nanoseconds())/1e6)
		if fl != nil {
			took, err := fl.ask((i*step)%sessions, i)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("grant floor: %w", err)
			}
			floors = append(floors, float64(took.Nanoseconds())/1e6)
		}
	}
	// The last grant is live: the use-time decision for its address says so.
	last := total - 1
	var d struct {
		Allowed   bool   `json:"allowed"`
		DecidedBy string `json:"decided_by"`
	}
	use := agent.UseRequest{Class: agent.ClassNetEgress, Op: "connect", IP: grantAddr(last), Port: 443}
	if _, _, err := post(hc, "/v1/decide", api.DecideBody{Session: fmt.Sprintf("s%d", (last*step)%sessions), Request: use}, &d); err != nil {
		return nil, nil, nil, err
	}
	if !d.Allowed {
		return nil, nil, nil, fmt.Errorf("after its grant, %s:443 is not allowed (decided by %q)", use.IP, d.DecidedBy)
	}
	revokes, err := revokeAll(hc, handles)
	handles = nil
	return times, floors, revokes, err
}
