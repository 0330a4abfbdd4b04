package dataplane

import (
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFileScopeMissingDeny: a deny entry on a path that does not exist is
// accepted and denies nothing that exists (the mount view has nothing to
// mask; where BPF LSM is active, in .ci/vmtest, the LSM has no inode to
// key: both skip it). A path made at that name is not denied until the
// session's entries are next applied, then it is: the limit the threat
// model states for both mechanisms.
func TestFileScopeMissingDeny(t *testing.T) {
	d, r := fsSession(t)
	fileGrant(t, d,
		backend.FileEntry{Path: r + "/repo", Access: backend.FileWrite},
		backend.FileEntry{Path: r + "/repo", Access: backend.FileRead},
		backend.FileEntry{Path: r + "/repo", Access: backend.FileDelete},
		backend.FileEntry{Path: r + "/repo/later", Access: backend.FileDeny})
	wantSh(t, d, "a deny on a missing path: the write root beside it", "echo x >> "+r+"/repo/f", true)
	wantSh(t, d, "the denied name made before the next apply (the shared limit)", "mkdir "+r+"/repo/later && echo x > "+r+"/repo/later/f && cat "+r+"/repo/later/f", true)
	fileGrant(t, d, backend.FileEntry{Path: r + "/other", Access: backend.FileRead})
	wantSh(t, d, "the name made, after the next apply: read", "cat "+r+"/repo/later/f", false)
	wantSh(t, d, "the name made, after the next apply: write", "echo y > "+r+"/repo/later/f", false)
	wantSh(t, d, "after the next apply: the write root beside it", "echo x >> "+r+"/repo/f", true)
}
