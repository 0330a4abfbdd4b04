package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestFileOverrideKernel: the admin override of a credential location end
// to end, through the agent's policy apply and reload, the Linux backend's
// mount view and the launcher (Landlock baseline included), each check a
// fresh process of the session: a broad read grant does not expose
// home/u/.ssh; a grant naming it does not either until an admin policy
// names it; removing the policy and reloading takes it back; the agent's
// own location (fixed) stays closed under a permit naming it.
func TestFileOverrideKernel(t *testing.T) {
	needZ3(t)
	kerneltest.RequireRoot(t)
	if _, err := os.Stat(boundary.DefaultCatatonit); err != nil {
		t.Skipf("no %s here (the boundary is tested on the host): %v", boundary.DefaultCatatonit, err)
	}
	root, err := os.MkdirTemp("/var/tmp", "shinken-override-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)
	for _, f := range []string{"home/u/notes", "home/u/.ssh/id_ed25519", "state/db"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("data\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ssh, state := root+"/home/u/.ssh", root+"/state"
	cfg := kernelConfig()
	cfg.Boundary = &boundary.Config{FileNever: []string{ssh, state}, FileNeverFixed: []string{state}}
	d, err := dataplane.Open(cfg)
	if err != nil {
		t.Fatalf("open dataplane: %v", err)
	}
	t.Cleanup(func() {
		if d2, err := dataplane.Open(cfg); err == nil {
			if err := d2.Uninstall(); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}
		d.Close()
	})
	ms, err := ParseManifests("fs.manifest", []byte("image dev\nallow fs.scope read="+root+" tier=auto\n"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := openAgent(t, d, t.TempDir(), func(c *Config) {
		c.Manifests = map[string]*Manifest{"dev": ms[0]}
		c.PolicyDir = dir
	})
	mustSession(t, a, SessionSpec{ID: "s1", Image: "dev"})
	cat := func(what, path string, want bool) {
		t.Helper()
		cmd := exec.Command("/bin/cat", path)
		cmd.Dir = "/"
		if err := d.Launch("s1", cmd, backend.LaunchOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := cmd.Wait() == nil; got != want {
			t.Errorf("%s: read %s: %v, want %v", what, path, got, want)
		} else {
			t.Logf("verified: %s: read %s: %v", what, path, got)
		}
	}
	grant := func(p string) {
		t.Helper()
		if _, err := a.Grant(ctx, GrantRequest{Session: "s1", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Read: []string{p}}}}); err != nil {
			t.Fatal(err)
		}
	}
	key := ssh + "/id_ed25519"
	grant(root)
	cat("a broad read grant", root+"/home/u/notes", true)
	cat("a broad read grant", key, false)
	grant(ssh)
	cat("a grant naming the credential, no admin policy", key, false)
	grant(state)
	admin := `@id("admin.ssh") permit (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource == Shinken::Capability::"fs.scope") when { context.request.path_keys.contains("` + ssh + `") || context.request.path_keys.contains("` + state + `") };`
	if _, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"ssh.cedar": admin}, AllowWidening: true}); err != nil {
		t.Fatal(err)
	}
	cat("an admin policy naming it", key, true)
	cat("an admin policy naming the agent's own location", state+"/db", false)
	if err := os.Remove(filepath.Join(dir, "ssh.cedar")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReloadPolicies(ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	cat("the policy removed and reloaded", key, false)
	cat("the policy removed and reloaded", root+"/home/u/notes", true)
}
