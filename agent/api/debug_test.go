package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

// TestPprofRootOnly: /debug/pprof/ is not served unless turned on, and
// when it is, only to a caller whose kernel credentials say uid 0 (an
// operator-group member is refused); an unknown profile is 404.
func TestPprofRootOnly(t *testing.T) {
	get := func(on bool, uid uint32, path string) int {
		srv, err := NewServer(Config{Agent: new(agent.Agent), Backend: backend.Unsupported{}, Hub: NewHub(4),
			Auth: Authorizer{OperatorGID: 4242}, Pprof: on})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("GET", path, nil)
		c := &connCreds{creds: Creds{PID: 1, UID: uid, GID: 4242}}
		r = r.WithContext(context.WithValue(r.Context(), credsKey{}, c))
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		on   bool
		uid  uint32
		path string
		want int
	}{
		{false, 0, "/debug/pprof/heap", http.StatusNotFound},
		{true, 1000, "/debug/pprof/heap", http.StatusForbidden},
		{true, 1000, "/debug/pprof/profile?seconds=1", http.StatusForbidden},
		{true, 0, "/debug/pprof/heap", http.StatusOK},
		{true, 0, "/debug/pprof/goroutine?debug=1", http.StatusOK},
		{true, 0, "/debug/pprof/nosuch", http.StatusNotFound},
		{true, 0, "/debug/pprof/profile?seconds=0", http.StatusBadRequest},
	} {
		if got := get(tc.on, tc.uid, tc.path); got != tc.want {
			t.Errorf("on=%v uid %d GET %s: %d, want %d", tc.on, tc.uid, tc.path, got, tc.want)
		}
	}
}
