package agent

// fs.scope narrowest-wins inside one grant, through the agent on the memory
// backend: the grant is accepted (it once was refused at validation), the
// use-time decision (DecideUse, what /v1/decide answers) and the backend's
// next open agree at every layer and axis, credential locations stay
// denied under the nested grant, and one revoke takes every layer at once.
// The kernel's side: dataplane/fsnest_linux_test.go.

import (
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

func TestFSScopeNestedThroughTheAgent(t *testing.T) {
	ms, err := ParseManifests("fs.manifest", []byte("image dev\nallow fs.scope read=/work write=/work delete=/work deny=/work/.git/hooks\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := newMemoryAgent(t, func(c *Config) { c.Manifests = map[string]*Manifest{"dev": ms[0]} })
	mustSession(t, m.Agent, SessionSpec{ID: "w", Image: "dev", Workspace: "/work"})
	// One grant: write /work/repo, deny /work/repo/a, write /work/repo/a/b,
	// deny /work/repo/a/b/c, write /work/repo/a/b/c/d; read only at
	// /work/repo (write never implies read); delete only in
	// /work/repo/a/b/tmp.
	c := Capability{Class: ClassFSScope, FS: &FSScope{
		Read:   []string{"/work/repo"},
		Write:  []string{"/work/repo", "/work/repo/a/b", "/work/repo/a/b/c/d"},
		Delete: []string{"/work/repo/a/b/tmp"},
		Deny:   []string{"/work/repo/a", "/work/repo/a/b/c", "/work/.git/hooks"},
	}}
	g, err := m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: c})
	if err != nil {
		t.Fatalf("the nested grant: %v", err)
	}
	cases := []struct {
		op, path string
		want     bool
	}{
		{"write", "/work/repo/f", true},
		{"read", "/work/repo/f", true},
		{"write", "/work/repo/a/f", false},
		{"read", "/work/repo/a/f", false},
		{"write", "/work/repo/a/b/f", true},
		{"read", "/work/repo/a/b/f", false}, // the write under the deny gives no read
		{"delete", "/work/repo/a/b/f", false},
		{"delete", "/work/repo/a/b/tmp/f", true},
		{"write", "/work/repo/a/b/c/f", false},
		{"write", "/work/repo/a/b/c/d/f", true},
		{"write", "/work/other", false},
	}
	check := func(when string) {
		t.Helper()
		for _, k := range cases {
			dec, err := m.DecideUse("w", UseRequest{Class: ClassFSScope, Op: k.op, Path: k.path})
			if err != nil {
				t.Fatal(err)
			}
			open, err := m.b.Open("w", k.path, backend.FileAccess(k.op))
			if err != nil {
				t.Fatal(err)
			}
			want := k.want && when == "granted"
			// The memory backend, as the mount view, lets delete where it
			// lets write (a mount is writable or not): a delete the
			// grammar refuses in a writable place is not compared.
			viewAgrees := k.op != "delete" || k.want
			if dec.Allowed != want {
				t.Errorf("%s: decide %s %s: %v (%s), want %v", when, k.op, k.path, dec.Allowed, dec.DecidedBy, want)
			}
			if viewAgrees && open != want {
				t.Errorf("%s: backend open %s %s: %v, want %v", when, k.op, k.path, open, want)
			}
		}
	}
	check("granted")
	if err := m.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	check("revoked")
	snap, _ := m.b.Snapshot()
	if n := len(snap.Deltas["w"].Files); n != 0 {
		t.Errorf("revoked nested grant: %d entries still held", n)
	}
}
