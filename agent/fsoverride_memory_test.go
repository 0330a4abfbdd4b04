package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// TestFileOverride: a credential location (/home/u/.ssh) stays closed
// under a broad read grant, under a grant naming it while no admin policy
// does, and under a broad grant while one does; a grant naming it opens it
// once an admin policy names it (its entry carries Override); removing the
// policy and reloading takes it back without touching the grant, applying
// it again gives it back; a restart keeps the override. The agent's own
// location (fixed) stays closed whatever the policy says. On the memory
// backend; the kernel's are dataplane/files_linux_test.go
// (TestFileScopeCredentials) and the launcher's Landlock baseline.
func TestFileOverride(t *testing.T) {
	needZ3(t)
	const state = "/var/lib/shinken"
	ms, err := ParseManifests("fs.manifest", []byte("image dev\nallow fs.scope read=/home/u,"+state+" tier=auto\n"))
	if err != nil {
		t.Fatal(err)
	}
	b := memory.MustNew(memory.Config{MaxSessions: 256, MaxHandles: 1024, FileNever: []string{"/home/u/.ssh", state}, FileNeverFixed: []string{state}})
	dir := t.TempDir()
	m := newMemoryAgentOn(t, b, func(c *Config) {
		c.Manifests = map[string]*Manifest{"dev": ms[0]}
		c.PolicyDir = dir
	})
	mustSession(t, m.Agent, SessionSpec{ID: "w", Image: "dev", Workspace: "/home/u"})
	read := func(p string) bool {
		t.Helper()
		ok, err := m.b.Open("w", p, backend.FileRead)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	grant := func(paths ...string) *Grant {
		t.Helper()
		g, err := m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Read: paths}}})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	key := "/home/u/.ssh/id_ed25519"
	grant("/home/u")
	if !read("/home/u/notes") || read(key) {
		t.Fatalf("broad grant: notes %v, the credential %v; want true, false", read("/home/u/notes"), read(key))
	}
	named := grant("/home/u/.ssh")
	if read(key) {
		t.Fatal("a grant naming the credential, no admin policy: opened")
	}
	admin := `@id("admin.ssh-for-w") permit (principal == Shinken::Session::"w", action == Shinken::Action::"use", resource == Shinken::Capability::"fs.scope") when { context.request.path_keys.contains("/home/u/.ssh") || context.request.path_keys.contains("` + state + `") };`
	if _, err := m.ApplyPolicies(PolicyChange{Files: map[string]string{"ssh.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	if !read(key) {
		t.Fatal("the admin policy applied, the grant naming the credential live: still closed")
	}
	if g := m.st.Grants[named.ID]; !slices.ContainsFunc(g.Delta.Files, func(e backend.FileEntry) bool { return e.Override }) {
		t.Errorf("the grant's record has no override: %v", g.Delta.Files)
	}
	// The broad grant alone does not open it, even with the policy.
	if err := m.Revoke(ctx, named.Handle); err != nil {
		t.Fatal(err)
	}
	if read(key) {
		t.Fatal("only the broad grant live, the admin policy in force: opened")
	}
	named = grant("/home/u/.ssh/id_ed25519")
	if !read(key) || read("/home/u/.ssh/other") {
		t.Errorf("a grant naming one file in it: the file %v, its sibling %v; want true, false", read(key), read("/home/u/.ssh/other"))
	}
	// The agent's own location: never.
	grant(state)
	if read(state + "/state.db") {
		t.Error("the agent's state directory opened by an admin policy")
	}
	// A restart keeps the override (reconcile compares it).
	m.reopen(t)
	if !read(key) {
		t.Fatal("the override did not survive a restart")
	}
	// Remove the policy, reload: taken back; apply again: given back.
	if err := os.Remove(filepath.Join(dir, "ssh.cedar")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReloadPolicies(ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	if read(key) {
		t.Fatal("the admin policy removed and reloaded: still open")
	}
	if g := m.st.Grants[named.ID]; slices.ContainsFunc(g.Delta.Files, func(e backend.FileEntry) bool { return e.Override }) {
		t.Errorf("the grant's record keeps its override: %v", g.Delta.Files)
	}
	if _, err := m.ApplyPolicies(PolicyChange{Files: map[string]string{"ssh.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	if !read(key) {
		t.Fatal("the policy applied again: closed")
	}
}
