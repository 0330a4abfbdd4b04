package agent

import (
	"errors"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFSDeleteThroughTheAgent: delete[] is a key of the grammar and its own
// bit in the Delta and in Cedar: a grant of delete alone is refused by a
// backend that cannot give delete apart from write (the memory backend
// models the Linux mount view) and leaves nothing; delete inside the
// grant's write root is granted, and Decide allows delete there and not
// elsewhere, and neither write nor delete gives read.
func TestFSDeleteThroughTheAgent(t *testing.T) {
	ms, err := ParseManifests("fs.manifest", []byte("image dev\nallow fs.scope read=/work/in write=/work delete=/work\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := newMemoryAgent(t, func(c *Config) { c.Manifests = map[string]*Manifest{"dev": ms[0]} })
	mustSession(t, m.Agent, SessionSpec{ID: "w", Image: "dev", Workspace: "/work"})
	_, err = m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Delete: []string{"/work/tmp"}}}})
	if !errors.Is(err, backend.ErrDeleteNeedsWrite) {
		t.Fatalf("delete alone: %v, want ErrDeleteNeedsWrite", err)
	}
	if snap, _ := m.b.Snapshot(); len(snap.Deltas["w"].Files) != 0 {
		t.Errorf("a refused delete grant left entries: %v", snap.Deltas["w"].Files)
	}
	g, err := m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Write: []string{"/work/out"}, Delete: []string{"/work/out/tmp"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Tier != TierNotify {
		t.Errorf("write and delete inside the workspace: tier %s, want notify", g.Tier)
	}
	rec := m.st.Grants[g.ID]
	var bits []backend.FileAccess
	for _, e := range rec.Delta.Files {
		bits = append(bits, e.Access)
	}
	if len(bits) != 2 || bits[0] != backend.FileWrite || bits[1] != backend.FileDelete {
		t.Errorf("the Delta's accesses: %v, want [write delete]", bits)
	}
	for _, c := range []struct {
		op, path string
		want     bool
	}{
		{"delete", "/work/out/tmp/x", true},
		{"delete", "/work/out/y", false},
		{"write", "/work/out/tmp/x", true},
		{"read", "/work/out/tmp/x", false},
		{"read", "/work/out/y", false},
	} {
		d, err := m.Decide("w", UseRequest{Class: ClassFSScope, Op: c.op, Path: c.path})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != c.want {
			t.Errorf("decide %s %s: %v, want %v", c.op, c.path, d.Allowed, c.want)
		}
	}
	if _, err := m.Grant(ctx, GrantRequest{Session: "w", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassFSScope, FS: &FSScope{Write: []string{"/work/x"}, Delete: []string{"/srv"}}}}); err == nil {
		t.Errorf("delete outside the manifest: granted")
	} else {
		t.Logf("verified: delete outside the manifest: %v", err)
	}
}
