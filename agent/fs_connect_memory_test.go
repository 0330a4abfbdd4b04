package agent

import (
	"errors"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFSConnectThroughTheAgent (issue 22, build item 5): an fs.scope
// connect grant through the agent on the memory backend: the named socket
// is reachable (Open connect) only while the grant lives; a container
// runtime socket is Block tier (a manifest cannot lower it), and the
// backend holds nothing of it.
func TestFSConnectThroughTheAgent(t *testing.T) {
	if _, err := ParseManifests("sock.manifest", []byte("image dev\nallow fs.scope connect=/run/docker.sock tier=auto\n")); err == nil {
		t.Error("a manifest lowered connect /run/docker.sock to auto")
	}
	ms, err := ParseManifests("sock.manifest", []byte("image dev\nallow fs.scope connect=/run/app.sock tier=auto\nallow fs.scope connect=/run/docker.sock\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := newMemoryAgent(t, func(c *Config) { c.Manifests = map[string]*Manifest{"dev": ms[0]} })
	mustSession(t, m.Agent, SessionSpec{ID: "w", Image: "dev", Workspace: "/work"})
	connect := func(p string) bool {
		t.Helper()
		ok, err := m.b.Open("w", p, backend.FileConnect)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if connect("/run/app.sock") {
		t.Fatal("connect before any grant")
	}
	g, err := m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Connect: []string{"/run/app.sock"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !connect("/run/app.sock") || connect("/run/other.sock") || connect("/run/app.sock/x") {
		t.Errorf("under the grant: app.sock %v, other.sock %v, app.sock/x %v", connect("/run/app.sock"), connect("/run/other.sock"), connect("/run/app.sock/x"))
	}
	if err := m.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if connect("/run/app.sock") {
		t.Error("connect after the revoke")
	}
	_, err = m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Connect: []string{"/run/docker.sock"}}}})
	if !errors.Is(err, ErrBlockTier) {
		t.Errorf("connect /run/docker.sock: %v, want %v", err, ErrBlockTier)
	}
	if connect("/run/docker.sock") {
		t.Error("the container runtime socket is reachable")
	}
	snap, _ := m.b.Snapshot()
	if len(snap.Deltas["w"].Files) != 0 {
		t.Errorf("entries held: %v", snap.Deltas["w"].Files)
	}
}
