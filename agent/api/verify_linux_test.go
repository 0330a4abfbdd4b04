package api

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

// TestVerifyFull: GET /v1/audit/verify passes full=1 on (incremental
// otherwise), answers 409 with the result when verification fails, and
// refuses a full value it does not know (400, nothing verified).
func TestVerifyFull(t *testing.T) {
	var calls []bool
	fail := false
	srv, err := NewServer(Config{Agent: new(agent.Agent), Backend: backend.Unsupported{}, Hub: NewHub(4),
		Auth: Authorizer{OperatorGID: callerGroup(), SessionsCgroup: "/shinken-no-such-cgroup"},
		Verify: func(full bool) (any, error) {
			calls = append(calls, full)
			if fail {
				return map[string]any{"records": 3}, errors.New("1 problem(s)")
			}
			return map[string]any{"records": 3}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := frontOn(t, srv, nil)
	get := func(path string) int {
		rc := dialRaw(t, sock)
		rc.send("GET " + path + " HTTP/1.1\r\nHost: shinken\r\n\r\n")
		rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(rc.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path string
		code int
		full []bool
	}{
		{"/v1/audit/verify", 200, []bool{false}},
		{"/v1/audit/verify?full=1", 200, []bool{true}},
		{"/v1/audit/verify?full=true", 200, []bool{true}},
		{"/v1/audit/verify?full=0", 200, []bool{false}},
		{"/v1/audit/verify?full=yes", 400, nil},
	} {
		calls = nil
		if got := get(tc.path); got != tc.code || len(calls) != len(tc.full) || (len(calls) == 1 && calls[0] != tc.full[0]) {
			t.Errorf("%s: %d, calls %v; want %d, %v", tc.path, got, calls, tc.code, tc.full)
		}
	}
	fail = true
	if got := get("/v1/audit/verify"); got != http.StatusConflict {
		t.Errorf("failed verification: %d, want 409", got)
	}
}
