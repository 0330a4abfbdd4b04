package agent

// fs.scope through the agent, on the memory backend (no root, any GOOS):
// the grant compiles to the Delta's files section, the backend's Open says
// what the next open gives, a revoke makes it fail, and reconcile after a
// restart keeps a live file grant (its entries are in the backend's
// Snapshot). The kernel's own tests are dataplane/files_linux_test.go.

import (
	"errors"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

func TestFSScopeThroughTheAgent(t *testing.T) {
	ms, err := ParseManifests("fs.manifest", []byte("image dev\nallow fs.scope read=/work write=/work deny=/work/.git/hooks\nallow fs.scope write=/srv\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := newMemoryAgent(t, func(c *Config) { c.Manifests = map[string]*Manifest{"dev": ms[0]} })
	mustSession(t, m.Agent, SessionSpec{ID: "w", Image: "dev", Workspace: "/work"})
	open := func(p string, op backend.FileAccess) bool {
		t.Helper()
		ok, err := m.b.Open("w", p, op)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if open("/work/a", backend.FileWrite) {
		t.Fatal("write before any grant")
	}
	// Writes inside the workspace: notify (granted at once).
	g, err := m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Read: []string{"/work"}, Write: []string{"/work"}, Deny: []string{"/work/.git/hooks"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Tier != TierNotify {
		t.Errorf("write inside the workspace: tier %s, want notify", g.Tier)
	}
	if !open("/work/a", backend.FileWrite) || !open("/work/a", backend.FileRead) || open("/work/.git/hooks/pre-commit", backend.FileWrite) || open("/srv/x", backend.FileWrite) {
		t.Errorf("after the grant: write /work/a %v, read %v, hook %v, /srv %v", open("/work/a", backend.FileWrite), open("/work/a", backend.FileRead), open("/work/.git/hooks/pre-commit", backend.FileWrite), open("/srv/x", backend.FileWrite))
	}
	// Outside it: ask.
	if _, err := m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Write: []string{"/srv"}}}}); !errors.Is(err, ErrApprovalRequired) {
		t.Errorf("write outside the workspace: %v, want %v", err, ErrApprovalRequired)
	}
	// A restart: reconcile finds the entries and keeps the grant.
	m.reopen(t)
	if !open("/work/a", backend.FileWrite) {
		t.Fatal("the file grant did not survive a restart")
	}
	if err := m.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if open("/work/a", backend.FileWrite) {
		t.Error("write after the revoke")
	}
	snap, _ := m.b.Snapshot()
	if len(snap.Deltas["w"].Files) != 0 {
		t.Errorf("revoked grant's entries still held: %v", snap.Deltas["w"].Files)
	}
}

// TestFSScopeNotEnforceable: on a host whose backend reports fs.scope
// unavailable, a file grant is refused (ErrNotEnforceable) and nothing is
// applied.
func TestFSScopeNotEnforceable(t *testing.T) {
	var classes []backend.Strength
	for _, c := range backend.Classes {
		classes = append(classes, backend.Strength{Class: c, Level: backend.Unavailable, Mechanism: "none", Reason: "test host"})
	}
	d := memory.MustNew(memory.Config{MaxSessions: 8, MaxHandles: 64, Classes: classes})
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1", Workspace: "/work"})
	if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: fsCap([]string{"/work/src"}, nil, nil), Lifecycle: LifecycleSession}); !errors.Is(err, ErrNotEnforceable) {
		t.Fatalf("fs.scope on a host without it: %v, want %v", err, ErrNotEnforceable)
	}
	if snap, _ := d.Snapshot(); len(snap.Deltas["s1"].Files) != 0 {
		t.Errorf("a refused grant left files: %v", snap.Deltas["s1"].Files)
	}
}

// TestMemoryCrashFS: the agent dies after each step of a file grant's
// GRANT and of its REVOKE; a new agent's reconcile leaves the backend's
// files section and the state in agreement, fail-closed: the entries of a
// live grant are held and open what they say, nothing else is held.
func TestMemoryCrashFS(t *testing.T) {
	fs := Capability{Class: ClassFSScope, FS: &FSScope{Read: []string{"/work"}, Write: []string{"/work/out"}}}
	agree := func(t *testing.T, m *memoryAgent, at string) {
		t.Helper()
		snap, err := m.b.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		held := snap.Deltas["s1"].Files
		var want []backend.FileEntry
		m.mu.Lock()
		for _, g := range m.st.Grants {
			if g.Session == "s1" && g.Phase == PhaseLive {
				want = append(want, g.Delta.Files...)
			}
		}
		m.mu.Unlock()
		if len(held) != len(want) || (backend.Delta{Files: want}).Missing(backend.Delta{Files: held}) != "" {
			t.Fatalf("after a crash at %s: backend holds %v, live grants %v", at, held, want)
		}
		ok, _ := m.b.Open("s1", "/work/out/x", backend.FileWrite)
		if ok != (len(want) > 0) {
			t.Fatalf("after a crash at %s: write /work/out/x %v with %d live entries", at, ok, len(want))
		}
	}
	for _, s := range GrantSteps {
		t.Run("grant/"+string(s), func(t *testing.T) {
			m := newMemoryAgent(t)
			mustSession(t, m.Agent, SessionSpec{ID: "s1", Workspace: "/work"}) // writes inside it: notify
			m.crash(t, memCrashAt{step: s}, func(a *Agent) error {
				_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: fs, Lifecycle: LifecycleSession})
				return err
			})
			m.reopen(t)
			agree(t, m, string(s))
		})
	}
	for _, s := range RevokeSteps {
		t.Run("revoke/"+string(s), func(t *testing.T) {
			m := newMemoryAgent(t)
			mustSession(t, m.Agent, SessionSpec{ID: "s1", Workspace: "/work"}) // writes inside it: notify
			g := m.grant(t, GrantRequest{Session: "s1", Capability: fs})
			m.crash(t, memCrashAt{step: s}, func(a *Agent) error { return a.Revoke(ctx, g.Handle) })
			m.reopen(t)
			agree(t, m, string(s))
			if ok, _ := m.b.Open("s1", "/work/out/x", backend.FileWrite); ok {
				t.Fatalf("a revoke that crashed at %s came back", s)
			}
		})
	}
}

// TestPersistenceThroughTheAgent: a persistence grant compiles to the
// files section (persist entries: writes allowed under the path), asks
// (default tier) outside system paths and is blocked on them; forgetting a
// name's kept paths is refused while its session exists.
func TestPersistenceThroughTheAgent(t *testing.T) {
	ms, err := ParseManifests("p.manifest", []byte("image dev\nallow persistence paths=/home/agent/.cache survives_session=true tier=notify\nallow persistence paths=/etc survives_session=true\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := newMemoryAgent(t, func(c *Config) { c.Manifests = map[string]*Manifest{"dev": ms[0]} })
	mustSession(t, m.Agent, SessionSpec{ID: "p", Image: "dev"})
	if _, err := m.Grant(ctx, GrantRequest{Session: "p", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/etc"}, SurvivesSession: true}}}); !errors.Is(err, ErrBlockTier) {
		t.Errorf("persistence of /etc: %v, want %v", err, ErrBlockTier)
	}
	g, err := m.Grant(ctx, GrantRequest{Session: "p", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/home/agent/.cache"}, SurvivesSession: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.b.Open("p", "/home/agent/.cache/x", backend.FileWrite); !ok {
		t.Errorf("write in the persistent path refused")
	}
	if snap, _ := m.b.Snapshot(); len(snap.Deltas["p"].Files) != 1 || snap.Deltas["p"].Files[0].Access != backend.FilePersist {
		t.Errorf("files section: %+v", snap.Deltas["p"].Files)
	}
	if err := m.ForgetPersisted("p"); !errors.Is(err, ErrSessionExists) {
		t.Errorf("forget while the session exists: %v", err)
	}
	if err := m.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if err := m.EndSession("p"); err != nil {
		t.Fatal(err)
	}
	if err := m.ForgetPersisted("p"); err != nil {
		t.Errorf("forget after the session ended: %v", err)
	}
}
