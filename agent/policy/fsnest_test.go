package policy

import (
	"math/rand/v2"
	"testing"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// TestDecideNestedFS: narrowest wins inside one fs.scope grant through
// Decide (the engine's per-class template bound to the grant) and through
// the linked policy ProveGrant checks: /repo write, /repo/a deny,
// /repo/a/b write; deeper alternations; and the axes apart (write and
// delete never imply read, a deny takes each axis only where it is deeper
// than that axis's entry).
func TestDecideNestedFS(t *testing.T) {
	e := newTestEngine(t, "")
	e.PutSession(testSession("s1"))
	grants := []GrantData{
		{ID: "g-nest", Session: "s1", Capability: Capability{Class: ClassFSScope, FS: &FSScope{
			Write: []string{"/repo", "/repo/a/b", "/repo/a/b/c/d", "/repo/a/b/c/d/e/f"},
			Deny:  []string{"/repo/a", "/repo/a/b/c", "/repo/a/b/c/d/e"},
		}}},
		{ID: "g-axes", Session: "s1", Capability: Capability{Class: ClassFSScope, FS: &FSScope{
			Read:   []string{"/src"},
			Write:  []string{"/src/a/b"},
			Delete: []string{"/src/a/b/tmp"},
			Deny:   []string{"/src/a"},
		}}},
	}
	for _, g := range grants {
		if err := g.Capability.Validate(); err != nil {
			t.Fatalf("%s: %v", g.ID, err)
		}
		if err := e.PutGrant(g); err != nil {
			t.Fatal(err)
		}
		if err := ProveGrant(g, t0); err != nil {
			t.Errorf("ProveGrant(%s): %v", g.ID, err)
		}
	}
	cases := []struct {
		op, path string
		want     bool
	}{
		{"write", "/repo/f", true},
		{"write", "/repo", true},
		{"write", "/repo/a", false},
		{"write", "/repo/a/x", false},
		{"write", "/repo/a/b", true},
		{"write", "/repo/a/b/x", true},
		{"write", "/repo/a/bx", false},
		{"write", "/repo/a/b/c", false},
		{"write", "/repo/a/b/c/x", false},
		{"write", "/repo/a/b/c/d/x", true},
		{"write", "/repo/a/b/c/d/e/x", false},
		{"write", "/repo/a/b/c/d/e/f/x", true},
		{"read", "/repo/f", false}, // write never implies read
		{"read", "/repo/a/b/x", false},
		{"delete", "/repo/a/b/x", false},
		{"read", "/src/x", true},
		{"read", "/src/a/x", false},
		{"read", "/src/a/b/x", false}, // the write under the deny gives no read
		{"write", "/src/a/b/x", true},
		{"write", "/src/x", false},
		{"delete", "/src/a/b/x", false},
		{"delete", "/src/a/b/tmp/x", true},
		{"write", "/src/a/b/tmp/x", true},
		{"read", "/src/a/b/tmp/x", false},
	}
	for _, c := range cases {
		q := UseRequest{Class: ClassFSScope, Op: c.op, Path: c.path}
		d, err := e.Decide("s1", q, t0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != c.want {
			t.Errorf("%s %s: Decide says %v (%v), want %v", c.op, c.path, d.Allowed, d.Reasons, c.want)
		}
	}
}

// nestPaths: one deep chain, siblings and near misses at each depth.
var nestPaths = []string{"/r", "/r/a", "/r/a/x", "/r/a/b", "/r/ab", "/r/a/b/c", "/r/a/b/c/y", "/r/a/b/c/d", "/r/a/b/c/d/e", "/r/a/b/c/d/e/f", "/r/a/b/c/d/e/f/g", "/r/a/b/c/d/e/f/g/h", "/q"}

// TestNestedFSAgrees: for random fs.scope grants with nesting up to
// MaxFSNesting levels, the grant's Cedar policy, the grammar
// (Capability.Allows) and the backends' rule (backend.FileRightsAt over the
// compiled Delta) agree on every axis at every path of the pool and below.
func TestNestedFSAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 23))
	sess := SessionAttrs{ID: "s"}
	ref := backend.HandleRef{Slot: 1, Generation: 1}
	var reqPaths []string
	for _, p := range nestPaths {
		reqPaths = append(reqPaths, p, p+"/z", p+"z")
	}
	checked := 0
	levels := map[int]int{}
	for checked < 400 {
		// Denies and each axis's entries drawn apart along the chain (so
		// they alternate often), plus random picks anywhere.
		var fs FSScope
		deny := r.IntN(2) == 0
		for _, p := range nestPaths {
			if r.IntN(4) == 0 {
				continue
			}
			if r.IntN(4) != 0 {
				deny = !deny
			}
			if deny {
				fs.Deny = append(fs.Deny, p)
				continue
			}
			fs.Write = append(fs.Write, p)
			for _, l := range []*[]string{&fs.Read, &fs.Delete} {
				if r.IntN(2) == 0 {
					*l = append(*l, p)
				}
			}
		}
		fs.Read = append(fs.Read, pick(r, nestPaths, 1)...)
		c := Capability{Class: ClassFSScope, FS: &fs}.Normalized()
		if c.Validate() != nil {
			continue
		}
		checked++
		for _, ax := range [][]string{c.FS.Read, c.FS.Write, c.FS.Delete} {
			levels[len(capability.FSLevels(ax, c.FS.Deny))]++
		}
		g := GrantData{ID: "g", Session: "s", Capability: c}
		pol := cedar.PolicyMap{"g": grantPolicy(g)}
		ents := types.EntityMap{grantUID("g"): grantEntity(g), sessionUID("s"): sessionEntity(sess)}
		files := capability.Compile(c, ref).Files
		for _, p := range reqPaths {
			rights := backend.FileRightsAt(files, p)
			for _, op := range []struct {
				name string
				kern bool
			}{{"read", rights.Read}, {"write", rights.Write}, {"delete", rights.Delete}} {
				q := UseRequest{Class: ClassFSScope, Op: op.name, Path: p}
				d, diag := cedar.Authorize(pol, ents, CedarRequest("s", q, t0))
				if len(diag.Errors) > 0 {
					t.Fatalf("%s on %+v: evaluation error %v", c, q, diag.Errors)
				}
				if (d == cedar.Allow) != c.Allows(q) || c.Allows(q) != op.kern {
					t.Fatalf("%s: %s %s: Cedar %v, grammar %v, backend %v", c, op.name, p, d == cedar.Allow, c.Allows(q), op.kern)
				}
			}
		}
	}
	if levels[capability.MaxFSNesting] == 0 || levels[3] == 0 {
		t.Fatalf("axes by nesting levels %v: the pool does not exercise the deeper sets", levels)
	}
	t.Logf("%d grants; axes by nesting levels: %v", checked, levels)
}
