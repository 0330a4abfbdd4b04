package api

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

// TestAuthPerConnection: the caller check is made on a connection's first
// request and holds for every later request on it: a caller inside the
// sessions' cgroup (here: this test's own cgroup) is refused on the first
// request and on the second, over the same keep-alive connection, and a
// caller outside is admitted on both.
func TestAuthPerConnection(t *testing.T) {
	own := ownCgroup(t)
	for _, tc := range []struct {
		cgroup string
		want   int
	}{{own, http.StatusForbidden}, {"/shinken-no-such-cgroup", http.StatusNotFound}} {
		srv, err := NewServer(Config{Agent: new(agent.Agent), Backend: backend.Unsupported{}, Hub: NewHub(4), Auth: Authorizer{OperatorGID: callerGroup(), SessionsCgroup: tc.cgroup}})
		if err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(t.TempDir(), "api.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: srv, ConnContext: ConnContext}
		go hs.Serve(ln)
		dials := 0
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			dials++
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
		for i := 0; i < 2; i++ {
			resp, err := hc.Get("http://shinken/v1/no-such-route")
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("sessions cgroup %q, request %d: HTTP %d, want %d", tc.cgroup, i+1, resp.StatusCode, tc.want)
			}
		}
		if dials != 1 {
			t.Errorf("%d connections, want one kept alive", dials)
		}
		hs.Close()
	}
}

// callerGroup is the operator group these tests admit: none as root (root
// is admitted anyway), the test's own group otherwise, so the tests of what
// happens after admission run without root too.
func callerGroup() int {
	if os.Geteuid() == 0 {
		return -1
	}
	return os.Getgid()
}
