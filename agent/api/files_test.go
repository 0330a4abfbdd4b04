package api

import (
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/backend"
)

func TestWorkspacePath(t *testing.T) {
	const ws = "/var/tmp/ws"
	for _, c := range []struct {
		p, abs, rel string
		err         error
	}{
		{"a/b.txt", ws + "/a/b.txt", "a/b.txt", nil},
		{ws + "/a", ws + "/a", "a", nil},
		{"./a//b", ws + "/a/b", "a/b", nil},
		{"", "", "", agent.ErrInvalidRequest},
		{"a\x00b", "", "", agent.ErrInvalidRequest},
		{ws, "", "", agent.ErrInvalidRequest},
		{".", "", "", agent.ErrInvalidRequest},
		{"..", "", "", backend.ErrFileOutside},
		{"../ws2/x", "", "", backend.ErrFileOutside},
		{"a/../b", "", "", backend.ErrFileOutside},
		{ws + "/../etc/passwd", "", "", backend.ErrFileOutside},
		{"/etc/passwd", "", "", backend.ErrFileOutside},
		{ws + "2/x", "", "", backend.ErrFileOutside},
	} {
		abs, rel, err := WorkspacePath(ws, c.p)
		if !errors.Is(err, c.err) || (c.err == nil && (abs != c.abs || rel != c.rel)) {
			t.Errorf("WorkspacePath(%q) = %q, %q, %v; want %q, %q, %v", c.p, abs, rel, err, c.abs, c.rel, c.err)
		}
	}
}

func TestBodyLimit(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         int64
	}{
		{"PUT", "/v1/sessions/s1/files", MaxFileBytes},
		{"GET", "/v1/sessions/s1/files", 1 << 20},
		{"POST", "/v1/sessions/s1/files", 1 << 20},
		{"POST", "/v1/sessions", 1 << 20},
		{"POST", "/v1/sessions/s1/processes", 1 << 20},
	} {
		r := httptest.NewRequest(c.method, c.path+"?path=x", nil)
		if got := bodyLimit(r); got != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got, c.want)
		}
	}
}
