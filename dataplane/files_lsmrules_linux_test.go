package dataplane

import (
	"errors"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFSLSMRules checks the inode entries the LSM gets for a session's
// file entries (the kernel side runs in .ci/vmtest's VM, where BPF LSM is
// active: TestFileScope*, TestConformance): at every inode they key, the
// rights of the grants' rules with all handles live (a deny rule giving
// nothing of its grant, as bpf/files.bpf.c's fs_entry reads them) equal
// what backend.FileRightsView says the mount view gives there. Cases: a
// deny on a path that does not exist is skipped (a read there is refused
// and changes nothing); a grant on one inode denied by another grant keeps
// its rights (nesting is per grant); an admin override on an entry naming
// a credential location opens it, on a broad entry above it or on the
// agent's own (fixed) location does not, and the grant's own broad entry
// does not close what its override entry names.
func TestFSLSMRules(t *testing.T) {
	r := fsTree(t)
	never := []string{r + "/home/u/.ssh", r + "/secret"}
	fixed := []string{r + "/secret"}
	h := func(n uint32) HandleRef { return HandleRef{Slot: n, Generation: 1} }
	cases := []struct {
		name    string
		entries []backend.FileEntry
		at      map[string]backend.FileRights // path -> rights the rules must give there
		absent  []string                      // paths with no inode entry
	}{
		{
			name: "a deny on a path that does not exist",
			entries: []backend.FileEntry{
				{Path: r + "/repo", Access: backend.FileWrite, Handle: h(1)},
				{Path: r + "/repo/none", Access: backend.FileDeny, Handle: h(1)},
				{Path: r + "/repo/a", Access: backend.FileDeny, Handle: h(1)},
			},
			at: map[string]backend.FileRights{r + "/repo": {Write: true}, r + "/repo/a": {Denied: true}},
		},
		{
			name: "a deny of one grant and a read of another on one inode",
			entries: []backend.FileEntry{
				{Path: r + "/repo", Access: backend.FileWrite, Handle: h(1)},
				{Path: r + "/repo/a", Access: backend.FileDeny, Handle: h(1)},
				{Path: r + "/repo/a", Access: backend.FileRead, Handle: h(2)},
			},
			at: map[string]backend.FileRights{r + "/repo": {Write: true}, r + "/repo/a": {Read: true}},
		},
		{
			name: "a broad read grant with an override",
			entries: []backend.FileEntry{
				{Path: r, Access: backend.FileRead, Handle: h(1), Override: true},
			},
			at: map[string]backend.FileRights{r: {Read: true}, r + "/home/u/.ssh": {Denied: true}, r + "/secret": {Denied: true}},
		},
		{
			name: "a named grant without an override",
			entries: []backend.FileEntry{
				{Path: r, Access: backend.FileRead, Handle: h(1), Override: true},
				{Path: r + "/home/u/.ssh", Access: backend.FileRead, Handle: h(2)},
			},
			at: map[string]backend.FileRights{r + "/home/u/.ssh": {Denied: true}},
		},
		{
			name: "a named grant with an override",
			entries: []backend.FileEntry{
				{Path: r, Access: backend.FileRead, Handle: h(1), Override: true},
				{Path: r + "/home/u/.ssh", Access: backend.FileRead, Handle: h(2), Override: true},
				{Path: r + "/home/u/.ssh", Access: backend.FileWrite, Handle: h(2)},
			},
			at: map[string]backend.FileRights{r + "/home/u/.ssh": {Read: true}},
		},
		{
			name: "a grant's broad entry beside its own override entry",
			entries: []backend.FileEntry{
				{Path: r + "/home", Access: backend.FileRead, Handle: h(1)},
				{Path: r + "/home/u/.ssh", Access: backend.FileRead, Handle: h(1), Override: true},
			},
			at: map[string]backend.FileRights{r + "/home": {Read: true}, r + "/home/u/.ssh": {Read: true}},
		},
		{
			name: "an override deeper than the location",
			entries: []backend.FileEntry{
				{Path: r + "/home", Access: backend.FileRead, Handle: h(1)},
				{Path: r + "/home/u/.ssh/id_ed25519", Access: backend.FileRead, Handle: h(1), Override: true},
			},
			at: map[string]backend.FileRights{r + "/home/u/.ssh": {Denied: true}, r + "/home/u/.ssh/id_ed25519": {Read: true}},
		},
		{
			name: "an override on the agent's own location",
			entries: []backend.FileEntry{
				{Path: r + "/secret", Access: backend.FileRead, Handle: h(1), Override: true},
			},
			at: map[string]backend.FileRights{r + "/secret": {Denied: true}},
		},
	}
	for _, c := range cases {
		want, err := fsLSMRules(7, c.entries, never, fixed)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		for p, exp := range c.at {
			dev, ino, err := fsInode(p)
			if err != nil {
				t.Fatal(err)
			}
			v := want[shkfsShkFsKey{Session: 7, Dev: dev, Ino: ino}]
			if v == nil {
				t.Errorf("%s: no inode entry at %s", c.name, p)
				continue
			}
			var got backend.FileRights
			for _, rl := range v.Rules[:v.Nrules] {
				if rl.Access&fsDenyBit != 0 {
					got.Denied = true
					continue
				}
				got.Read = got.Read || rl.Access&1 != 0
				got.Write = got.Write || rl.Access&2 != 0
				got.Delete = got.Delete || rl.Access&4 != 0
			}
			if !got.None() {
				got.Denied = false
			}
			view := backend.FileRightsView(c.entries, never, fixed, p)
			if got != exp || got != view {
				t.Errorf("%s: at %s the rules give %+v, want %+v (the mount view's: %+v)", c.name, p, got, exp, view)
			} else {
				t.Logf("verified: %s: at %s %+v, as the mount view", c.name, p, got)
			}
		}
	}
	// Bad input: a read, write or delete entry on a path that does not
	// exist is refused (only a deny there denies nothing that exists).
	_, err := fsLSMRules(7, []backend.FileEntry{{Path: r + "/none", Access: backend.FileRead, Handle: h(1)}}, never, fixed)
	if !errors.Is(err, backend.ErrInvalidFileEntry) {
		t.Errorf("a read entry on a path that does not exist: %v, want ErrInvalidFileEntry", err)
	}
	// More grants on one inode than a kernel entry holds: refused.
	var many []backend.FileEntry
	for i := range uint32(9) {
		many = append(many, backend.FileEntry{Path: r + "/repo", Access: backend.FileRead, Handle: h(i + 1)})
	}
	if _, err := fsLSMRules(7, many, never, fixed); !errors.Is(err, backend.ErrInvalidFileEntry) {
		t.Errorf("9 grants on one inode: %v, want ErrInvalidFileEntry", err)
	}
}
