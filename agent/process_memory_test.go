package agent

// The process class through the agent, on the memory backend (no root, any
// GOOS): the grant compiles to the Delta's process section, the backend's
// Exec and ProcessBound say what the next exec and fork get, a revoke makes
// the next exec fail, reconcile after a restart keeps a live grant, and a
// crash at any step of GRANT or REVOKE leaves the backend and the state in
// agreement. The kernel's own tests are dataplane/process_linux_test.go.

import (
	"errors"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// procAgent is a memory agent whose image "dev" allows process grants.
func procAgent(t *testing.T) *memoryAgent {
	t.Helper()
	ms, err := ParseManifests("p.manifest", []byte("image dev\nallow process exec=/usr/bin/id max_processes=64\n"))
	if err != nil {
		t.Fatal(err)
	}
	return newMemoryAgent(t, func(c *Config) { c.Manifests = map[string]*Manifest{"dev": ms[0]} })
}

func TestProcessThroughTheAgent(t *testing.T) {
	m := procAgent(t)
	mustSession(t, m.Agent, SessionSpec{ID: "p", Image: "dev"})
	exec := func(p string) bool {
		t.Helper()
		ok, err := m.b.Exec("p", p)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !exec("/usr/bin/id") {
		t.Fatal("a session with no process grant is gated")
	}
	// A bound alone: notify (granted at once); it gates the session.
	g1, err := m.Grant(ctx, GrantRequest{Session: "p", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassProcess, Process: &ProcessScope{MaxProcesses: 16}}})
	if err != nil {
		t.Fatal(err)
	}
	if g1.Tier != TierNotify {
		t.Errorf("max_processes alone: tier %s, want notify", g1.Tier)
	}
	if exec("/usr/bin/id") {
		t.Error("a program off every list ran in a gated session")
	}
	if n, _ := m.b.ProcessBound("p"); n != 16 {
		t.Errorf("bound %d, want 16", n)
	}
	// Programs: ask.
	if _, err := m.Grant(ctx, GrantRequest{Session: "p", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassProcess, Process: &ProcessScope{Exec: []string{"/usr/bin/id"}, MaxProcesses: 64}}}); !errors.Is(err, ErrApprovalRequired) {
		t.Errorf("an exec grant: %v, want %v", err, ErrApprovalRequired)
	}
	if _, err := m.Grant(ctx, GrantRequest{Session: "p", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassProcess, Process: &ProcessScope{MaxProcesses: 65}}}); !errors.Is(err, ErrOutsideManifest) {
		t.Errorf("max_processes past the manifest's: %v", err)
	}
	m.reopen(t)
	if n, _ := m.b.ProcessBound("p"); n != 16 {
		t.Errorf("after a restart: bound %d, want 16", n)
	}
	if err := m.Revoke(ctx, g1.Handle); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.b.ProcessBound("p"); n != 0 {
		t.Errorf("every process grant revoked: bound %d, want 0", n)
	}
	if snap, _ := m.b.Snapshot(); len(snap.Deltas["p"].Process) != 0 {
		t.Errorf("revoked grant's entries still held: %v", snap.Deltas["p"].Process)
	}
}

// TestMemoryCrashProcess: the agent dies after each step of a process
// grant's GRANT and of its REVOKE; a new agent's reconcile leaves the
// backend's process section and the state in agreement, fail-closed.
func TestMemoryCrashProcess(t *testing.T) {
	pc := Capability{Class: ClassProcess, Process: &ProcessScope{MaxProcesses: 32}}
	agree := func(t *testing.T, m *memoryAgent, at string) {
		t.Helper()
		snap, err := m.b.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		held := snap.Deltas["s1"].Process
		var want []backend.ProcessEntry
		m.mu.Lock()
		for _, g := range m.st.Grants {
			if g.Session == "s1" && g.Phase == PhaseLive {
				want = append(want, g.Delta.Process...)
			}
		}
		m.mu.Unlock()
		if len(held) != len(want) || (backend.Delta{Process: want}).Missing(backend.Delta{Process: held}) != "" {
			t.Fatalf("after a crash at %s: backend holds %v, live grants %v", at, held, want)
		}
	}
	for _, s := range GrantSteps {
		t.Run("grant/"+string(s), func(t *testing.T) {
			m := procAgent(t)
			mustSession(t, m.Agent, SessionSpec{ID: "s1", Image: "dev"})
			m.crash(t, memCrashAt{step: s}, func(a *Agent) error {
				_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: pc, Lifecycle: LifecycleSession})
				return err
			})
			m.reopen(t)
			agree(t, m, string(s))
		})
	}
	for _, s := range RevokeSteps {
		t.Run("revoke/"+string(s), func(t *testing.T) {
			m := procAgent(t)
			mustSession(t, m.Agent, SessionSpec{ID: "s1", Image: "dev"})
			g := m.grant(t, GrantRequest{Session: "s1", Capability: pc})
			m.crash(t, memCrashAt{step: s}, func(a *Agent) error { return a.Revoke(ctx, g.Handle) })
			m.reopen(t)
			agree(t, m, string(s))
			if n, _ := m.b.ProcessBound("s1"); n != 0 {
				t.Fatalf("a revoke that crashed at %s came back (bound %d)", s, n)
			}
		})
	}
}
