package backendtest

import (
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// testUseFilesNested: narrowest wins inside ONE grant (fs.scope write
// /repo, deny /repo/a, write /repo/a/b in a single Delta under one
// handle), with a deeper alternation (deny /repo/a/b/c, write
// /repo/a/b/c/d), and one revoke taking all of its layers at once.
func testUseFilesNested(t *testing.T, s *suite) {
	b, u := s.files(t)
	root := u.FileTree(t, "repo/f", "repo/a/f", "repo/a/b/f", "repo/a/b/c/f", "repo/a/b/c/d/f", "other/f")
	mustSession(t, b, "s1")
	mustSession(t, b, "s2")
	h := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", files(h,
		backend.FileEntry{Path: root + "/repo", Access: backend.FileWrite},
		backend.FileEntry{Path: root + "/repo/a", Access: backend.FileDeny},
		backend.FileEntry{Path: root + "/repo/a/b", Access: backend.FileWrite},
		backend.FileEntry{Path: root + "/repo/a/b/c", Access: backend.FileDeny},
		backend.FileEntry{Path: root + "/repo/a/b/c/d", Access: backend.FileWrite},
	))
	for p, w := range map[string]bool{
		"/repo/f":         true,
		"/repo/a/f":       false,
		"/repo/a/b/f":     true,
		"/repo/a/b/c/f":   false,
		"/repo/a/b/c/d/f": true,
		"/other/f":        false,
	} {
		wantOpen(t, u, "s1", root+p, backend.FileWrite, w)
		wantOpen(t, u, "s2", root+p, backend.FileWrite, false) // another session's grant
	}
	wantOpen(t, u, "s1", root+"/repo/a/f", backend.FileRead, false)
	wantOpen(t, u, "s1", root+"/repo/a/b/c/f", backend.FileRead, false)
	// The entries are held as given, once.
	if got := snapshot(t, b).Deltas["s1"].Files; len(got) != 5 {
		t.Errorf("snapshot files %v, want the 5 entries", got)
	}
	// One revoke: every layer goes at once (one write) and the writes fail.

	ops := opsDelta(b, func() { mustRevoke(t, b, h) })
	if ops.RevokeWrites != 1 || ops.Sweeps > 1 || ops.ViewSweeps > 1 {
		t.Errorf("revoke of a nested file grant: %+v, want one write, at most one sweep and one view sweep", ops)
	}
	for _, p := range []string{"/repo/f", "/repo/a/b/f", "/repo/a/b/c/d/f"} {
		wantOpen(t, u, "s1", root+p, backend.FileWrite, false)
	}
}
