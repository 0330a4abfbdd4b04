package boundary

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

func fe(path string, a backend.FileAccess, slot uint32) backend.FileEntry {
	return backend.FileEntry{Path: path, Access: a, Handle: backend.HandleRef{Slot: slot, Generation: 1}}
}

func feo(path string, a backend.FileAccess, slot uint32) backend.FileEntry {
	e := fe(path, a, slot)
	e.Override = true
	return e
}

func layoutString(l []ViewMount) []string {
	var out []string
	for _, m := range l {
		s := fmt.Sprintf("%s=%s", m.Path, m.State)
		if m.Pin {
			s += "(pin)"
		}
		out = append(out, s)
	}
	return out
}

// TestLayout: the mounts a view needs, for the nested write/deny/write
// case (across grants and inside one), credential locations under a broad grant, a workspace with its
// protected paths, and a grant's deny inside the workspace.
func TestLayout(t *testing.T) {
	for _, c := range []struct {
		name string
		spec ViewSpec
		want []string
	}{
		{"sockets: exact, deeper than their grant's deny; a deny of the very path takes it", ViewSpec{Files: []backend.FileEntry{fe("/run/a.sock", backend.FileConnect, 1), fe("/run/d/b.sock", backend.FileConnect, 2), fe("/run/d", backend.FileDeny, 2), fe("/run/c.sock", backend.FileConnect, 3), fe("/run", backend.FileDeny, 4), fe("/run/e.sock", backend.FileConnect, 5), fe("/run/e.sock", backend.FileDeny, 5)}},
			[]string{"/run=deny", "/run/a.sock=socket", "/run/c.sock=socket", "/run/d/b.sock=socket"}},
		{"nested across grants", ViewSpec{Files: []backend.FileEntry{fe("/repo", backend.FileWrite, 1), fe("/repo/a", backend.FileDeny, 1), fe("/repo/a/b", backend.FileWrite, 2)}},
			[]string{"/repo=write", "/repo/a=deny", "/repo/a/b=write"}},
		{"narrowest wins inside one grant", ViewSpec{Files: []backend.FileEntry{fe("/repo", backend.FileWrite, 1), fe("/repo/a", backend.FileDeny, 1), fe("/repo/a/b", backend.FileWrite, 1)}},
			[]string{"/repo=write", "/repo/a=deny", "/repo/a/b=write"}},
		{"deeper alternation inside one grant", ViewSpec{Files: []backend.FileEntry{fe("/repo", backend.FileWrite, 1), fe("/repo/a", backend.FileDeny, 1), fe("/repo/a/b", backend.FileWrite, 1), fe("/repo/a/b/c", backend.FileDeny, 1), fe("/repo/a/b/c/d", backend.FileWrite, 1)}},
			[]string{"/repo=write", "/repo/a=deny", "/repo/a/b=write", "/repo/a/b/c=deny", "/repo/a/b/c/d=write"}},
		{"the axes apart inside one grant", ViewSpec{Files: []backend.FileEntry{fe("/src", backend.FileRead, 1), fe("/src/a", backend.FileDeny, 1), fe("/src/a/b", backend.FileWrite, 1)}},
			[]string{"/src=read", "/src/a=deny", "/src/a/b=write"}},
		{"credentials under a broad grant", ViewSpec{Files: []backend.FileEntry{fe("/home", backend.FileRead, 1)}, Never: []string{"/home/u/.ssh", "/root", "/etc/shadow"}},
			[]string{"/home=read", "/home/u/.ssh=deny"}},
		{"an override on a broad grant opens nothing", ViewSpec{Files: []backend.FileEntry{feo("/home", backend.FileRead, 1)}, Never: []string{"/home/u/.ssh"}},
			[]string{"/home=read", "/home/u/.ssh=deny"}},
		{"an override on a grant naming it: a mount of its own", ViewSpec{Files: []backend.FileEntry{fe("/home", backend.FileWrite, 1), feo("/home/u/.ssh", backend.FileRead, 2)}, Never: []string{"/home/u/.ssh"}},
			[]string{"/home=write", "/home/u=write(pin)", "/home/u/.ssh=read"}},
		{"an override on a file in it", ViewSpec{Files: []backend.FileEntry{fe("/home", backend.FileRead, 1), feo("/home/u/.ssh/config", backend.FileRead, 2)}, Never: []string{"/home/u/.ssh"}},
			[]string{"/home=read", "/home/u/.ssh=deny", "/home/u/.ssh/config=read"}},
		{"no override of a fixed location", ViewSpec{Files: []backend.FileEntry{feo("/var/lib/shinken", backend.FileRead, 1)}, Never: []string{"/var/lib/shinken"}, Fixed: []string{"/var/lib/shinken"}},
			[]string{"/var/lib/shinken=deny"}},
		{"credential above a grant", ViewSpec{Files: []backend.FileEntry{fe("/root/x", backend.FileWrite, 1)}, Never: []string{"/root"}},
			[]string{"/root=deny"}},
		{"workspace", ViewSpec{Workspace: &backend.Workspace{Dir: "/w", Mode: backend.ModeWorkspaceWrite, Protected: []string{"/w/.git/config", "/w/.git/hooks"}}},
			[]string{"/w=write", "/w/.git=write(pin)", "/w/.git/config=read", "/w/.git/hooks=read"}},
		{"read-only workspace", ViewSpec{Workspace: &backend.Workspace{Dir: "/w", Mode: backend.ModeReadOnly, Protected: []string{"/w/.git/config"}}},
			[]string{"/w=read"}},
		{"read grant is no write in a read-only workspace; write grant is", ViewSpec{Workspace: &backend.Workspace{Dir: "/w", Mode: backend.ModeReadOnly},
			Files: []backend.FileEntry{fe("/w/out", backend.FileWrite, 1), fe("/w/in", backend.FileRead, 2)}},
			[]string{"/w=read", "/w/out=write"}},
		{"pins between a write root and a deeper mount", ViewSpec{Files: []backend.FileEntry{fe("/w", backend.FileWrite, 1), fe("/w/x/y/d", backend.FileDeny, 1)}},
			[]string{"/w=write", "/w/x=write(pin)", "/w/x/y=write(pin)", "/w/x/y/d=deny"}},
	} {
		got := layoutString(c.spec.Layout())
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestViewChange: only what changed is remounted: a mount and everything
// below it, and a mask above it (its mount points); writable mounts that
// go are listed deepest first.
func TestViewChange(t *testing.T) {
	old := ViewSpec{Files: []backend.FileEntry{fe("/repo", backend.FileWrite, 1), fe("/repo/a", backend.FileDeny, 1), fe("/other", backend.FileWrite, 3)}}.Layout()
	add := ViewSpec{Files: []backend.FileEntry{fe("/repo", backend.FileWrite, 1), fe("/repo/a", backend.FileDeny, 1), fe("/repo/a/b", backend.FileWrite, 2), fe("/other", backend.FileWrite, 3)}}.Layout()
	rm, at := ViewChange(old, add)
	if got, want := layoutString(rm), []string{"/repo/a=deny"}; !slices.Equal(got, want) {
		t.Errorf("remove %v, want %v", got, want)
	}
	if got, want := layoutString(at), []string{"/repo/a=deny", "/repo/a/b=write"}; !slices.Equal(got, want) {
		t.Errorf("attach %v, want %v", got, want)
	}
	// Revoking grant 1 takes /repo and everything below it; /other stays.
	rev := ViewSpec{Files: []backend.FileEntry{fe("/repo/a/b", backend.FileWrite, 2), fe("/other", backend.FileWrite, 3)}}.Layout()
	rm, at = ViewChange(add, rev)
	if got, want := layoutString(rm), []string{"/repo/a/b=write", "/repo/a=deny", "/repo=write"}; !slices.Equal(got, want) {
		t.Errorf("remove %v, want %v", got, want)
	}
	if got, want := layoutString(at), []string{"/repo/a/b=write"}; !slices.Equal(got, want) {
		t.Errorf("attach %v, want %v", got, want)
	}
	if rm, at := ViewChange(rev, rev); len(rm)+len(at) != 0 {
		t.Errorf("no change changed %v %v", rm, at)
	}
}

// TestLayoutRelevantNever: the layout that walks only the credential
// locations relevantNever keeps is the one that walks them all, over
// random specs (nested grants of every access, overrides, a workspace with
// protected paths, persistent paths, locations above, below and beside
// them).
func TestLayoutRelevantNever(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 21))
	path := func() string {
		p := ""
		for range 1 + rng.IntN(4) {
			p += "/" + []string{"a", "b", "c"}[rng.IntN(3)]
		}
		return p
	}
	access := []backend.FileAccess{backend.FileRead, backend.FileWrite, backend.FileDelete, backend.FileDeny, backend.FilePersist, backend.FilePersistSession, backend.FileConnect}
	for i := range 20000 {
		v := ViewSpec{PersistKeep: "/keep", PersistSession: "/sess", PersistMerged: rng.IntN(2) == 0}
		for range rng.IntN(5) {
			e := fe(path(), access[rng.IntN(len(access))], uint32(1+rng.IntN(3)))
			e.Override = rng.IntN(3) == 0
			v.Files = append(v.Files, e)
		}
		for range rng.IntN(8) {
			n := path()
			if !slices.Contains(v.Never, n) {
				v.Never = append(v.Never, n)
				if rng.IntN(4) == 0 {
					v.Fixed = append(v.Fixed, n)
				}
			}
		}
		if rng.IntN(3) == 0 {
			w := &backend.Workspace{Dir: path(), Mode: backend.ModeReadOnly}
			if rng.IntN(2) == 0 {
				w.Mode = backend.ModeWorkspaceWrite
			}
			for range rng.IntN(3) {
				w.Protected = append(w.Protected, w.Dir+path())
			}
			v.Workspace = w
		}
		all, some := v.layoutOf(false), v.Layout()
		if !slices.Equal(all, some) {
			t.Fatalf("spec %d %+v: walking every location %v, the relevant ones %v", i, v, layoutString(all), layoutString(some))
		}
	}
}
