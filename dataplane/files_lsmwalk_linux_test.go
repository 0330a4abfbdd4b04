package dataplane

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// kernelWalk is what bpf/files.bpf.c's fs_check decides from the inode
// entries want at path p when the handles in dead are revoked: the walk up
// p's ancestors stops at the first inode with a live rule, whose live
// rules' accesses (a deny rule giving nothing) add up; past the root with
// none, nothing (the session's outside access, the mount view's to decide,
// is not what these rules say).
func kernelWalk(t *testing.T, want map[shkfsShkFsKey]*shkfsShkFsValue, p string, dead []HandleRef) backend.FileRights {
	t.Helper()
	for q := p; ; q = filepath.Dir(q) {
		dev, ino, err := fsInode(q)
		if err != nil {
			t.Fatal(err)
		}
		if v := want[shkfsShkFsKey{Session: 7, Dev: dev, Ino: ino}]; v != nil {
			live, have := false, uint32(0)
			for _, r := range v.Rules[:v.Nrules] {
				if slices.Contains(dead, HandleRef{Slot: r.Handle, Generation: r.Generation}) {
					continue
				}
				live = true
				if r.Access&fsDenyBit == 0 {
					have |= r.Access
				}
			}
			if live {
				return backend.FileRights{Read: have&1 != 0, Write: have&2 != 0, Delete: have&4 != 0}
			}
		}
		if q == "/" {
			return backend.FileRights{}
		}
	}
}

// TestFSLSMRulesWalk: the kernel's walk over the inode entries fsLSMRules
// writes (modelled by kernelWalk, as fs_check reads them) gives at every
// file and directory of the tree what backend.FileRightsView gives there
// for the live grants' entries, with every subset of the grants revoked:
// narrowest wins inside one grant (write /repo, deny /repo/a, write
// /repo/a/b; the axes apart), the grants' rights add up across grants (a
// write of one grant above a read of another keeps the write below the
// read), a revoke is one handle's rules going dead at once, and credential
// locations stay closed under a broad grant with nesting.
func TestFSLSMRulesWalk(t *testing.T) {
	r := fsTree(t)
	never := []string{r + "/home/u/.ssh", r + "/secret"}
	fixed := []string{r + "/secret"}
	h := func(n uint32) HandleRef { return HandleRef{Slot: n, Generation: 1} }
	var paths []string
	for _, f := range []string{"", "repo", "repo/f", "repo/a", "repo/a/f", "repo/a/b", "repo/a/b/f", "other", "other/f", "home", "home/u", "home/u/notes", "home/u/.ssh", "home/u/.ssh/id_ed25519", "secret", "secret/f"} {
		paths = append(paths, filepath.Join(r, f))
	}
	cases := []struct {
		name    string
		entries []backend.FileEntry
	}{
		{"nested in one grant", []backend.FileEntry{
			{Path: r + "/repo", Access: backend.FileWrite, Handle: h(1)},
			{Path: r + "/repo/a", Access: backend.FileDeny, Handle: h(1)},
			{Path: r + "/repo/a/b", Access: backend.FileWrite, Handle: h(1)},
		}},
		{"the axes apart in one grant", []backend.FileEntry{
			{Path: r + "/repo", Access: backend.FileRead, Handle: h(1)},
			{Path: r + "/repo/a", Access: backend.FileDeny, Handle: h(1)},
			{Path: r + "/repo/a/b", Access: backend.FileWrite, Handle: h(1)},
			{Path: r + "/repo/a/b/f", Access: backend.FileDelete, Handle: h(1)},
			{Path: r + "/other", Access: backend.FileWrite, Handle: h(1)},
		}},
		{"across grants", []backend.FileEntry{
			{Path: r + "/repo", Access: backend.FileWrite, Handle: h(1)},
			{Path: r + "/repo/a", Access: backend.FileRead, Handle: h(2)},
			{Path: r + "/repo/a/b", Access: backend.FileDeny, Handle: h(2)},
			{Path: r + "/repo/a/b/f", Access: backend.FileRead, Handle: h(2)},
			{Path: r + "/repo/a", Access: backend.FileDeny, Handle: h(3)},
			{Path: r + "/repo", Access: backend.FileRead, Handle: h(3)},
		}},
		{"a broad nested grant over credential locations", []backend.FileEntry{
			{Path: r, Access: backend.FileRead, Handle: h(1), Override: true},
			{Path: r + "/home", Access: backend.FileDeny, Handle: h(1)},
			{Path: r + "/home/u", Access: backend.FileRead, Handle: h(1)},
			{Path: r + "/home/u/.ssh/id_ed25519", Access: backend.FileRead, Handle: h(2), Override: true},
			{Path: r + "/home/u", Access: backend.FileWrite, Handle: h(2)},
		}},
	}
	for _, c := range cases {
		want, err := fsLSMRules(7, c.entries, never, fixed)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var hs []HandleRef
		for _, e := range c.entries {
			if !slices.Contains(hs, e.Handle) {
				hs = append(hs, e.Handle)
			}
		}
		for mask := 0; mask < 1<<len(hs); mask++ {
			var dead []HandleRef
			for i, x := range hs {
				if mask&(1<<i) != 0 {
					dead = append(dead, x)
				}
			}
			live := slices.DeleteFunc(slices.Clone(c.entries), func(e backend.FileEntry) bool { return slices.Contains(dead, e.Handle) })
			for _, p := range paths {
				got := kernelWalk(t, want, p, dead)
				view := backend.FileRightsView(live, never, fixed, p)
				view.Denied = false
				if got != view {
					t.Errorf("%s, revoked %v: at %s the kernel's walk gives %+v, the view %+v", c.name, dead, p, got, view)
				}
			}
		}
	}
	// The nested case in words: write at /repo and /repo/a/b, nothing in
	// the rest of /repo/a.
	want, err := fsLSMRules(7, cases[0].entries, never, fixed)
	if err != nil {
		t.Fatal(err)
	}
	for p, w := range map[string]bool{r + "/repo/f": true, r + "/repo/a/f": false, r + "/repo/a/b/f": true} {
		if got := kernelWalk(t, want, p, nil); got.Write != w || got.Read {
			t.Errorf("nested: at %s the walk gives %+v, want write %v and no read", p, got, w)
		}
	}
}
