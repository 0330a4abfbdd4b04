package dataplane

import (
	"os"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFileScopeNestedOneGrant: narrowest wins inside ONE grant through the
// launcher, in a fresh session: write /repo, deny /repo/a, write /repo/a/b
// (and a deeper deny /repo/a/b/c, write /repo/a/b/c/d) under one handle;
// writes, creates and reads at each layer; a credential location under a
// broad nested grant stays denied; one revoke removes every layer at once
// (one write, one view sweep), the denies included.
func TestFileScopeNestedOneGrant(t *testing.T) {
	d, r := fsSession(t)
	for _, dir := range []string{"/repo/a/b/c/d"} {
		if err := os.MkdirAll(r+dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"/repo/a/b/c/f", "/repo/a/b/c/d/f"} {
		if err := os.WriteFile(r+f, []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// write with delete: where BPF LSM is active (.ci/vmtest) write alone
	// deletes nothing; read beside it: write never implies read there.
	h := fileGrant(t, d,
		backend.FileEntry{Path: r + "/repo", Access: backend.FileRead},
		backend.FileEntry{Path: r + "/repo", Access: backend.FileWrite},
		backend.FileEntry{Path: r + "/repo", Access: backend.FileDelete},
		backend.FileEntry{Path: r + "/repo/a", Access: backend.FileDeny},
		backend.FileEntry{Path: r + "/repo/a/b", Access: backend.FileRead},
		backend.FileEntry{Path: r + "/repo/a/b", Access: backend.FileWrite},
		backend.FileEntry{Path: r + "/repo/a/b", Access: backend.FileDelete},
		backend.FileEntry{Path: r + "/repo/a/b/c", Access: backend.FileDeny},
		backend.FileEntry{Path: r + "/repo/a/b/c/d", Access: backend.FileRead},
		backend.FileEntry{Path: r + "/repo/a/b/c/d", Access: backend.FileWrite},
	)
	wantSh(t, d, "write in /repo", "echo x >> "+r+"/repo/f", true)
	wantSh(t, d, "create and delete in /repo", "echo x > "+r+"/repo/new && rm "+r+"/repo/new", true)
	wantSh(t, d, "write in /repo/a", "echo x >> "+r+"/repo/a/f", false)
	wantSh(t, d, "read in /repo/a", "cat "+r+"/repo/a/f", false)
	wantSh(t, d, "create in /repo/a", "echo x > "+r+"/repo/a/new", false)
	wantSh(t, d, "delete in /repo/a", "rm "+r+"/repo/a/f", false)
	wantSh(t, d, "write in /repo/a/b", "echo x >> "+r+"/repo/a/b/f", true)
	wantSh(t, d, "read in /repo/a/b", "cat "+r+"/repo/a/b/f", true)
	wantSh(t, d, "create and delete in /repo/a/b", "echo x > "+r+"/repo/a/b/new && rm "+r+"/repo/a/b/new", true)
	wantSh(t, d, "write in /repo/a/b/c", "echo x >> "+r+"/repo/a/b/c/f", false)
	wantSh(t, d, "read in /repo/a/b/c", "cat "+r+"/repo/a/b/c/f", false)
	wantSh(t, d, "write in /repo/a/b/c/d", "echo x >> "+r+"/repo/a/b/c/d/f", true)
	wantSh(t, d, "escape by .. from /repo/a/b into /repo/a", "echo x >> "+r+"/repo/a/b/../f", false)
	wantSh(t, d, "rename out of /repo/a into /repo", "mv "+r+"/repo/a/f "+r+"/repo/stolen", false)
	wantSh(t, d, "write outside", "echo x >> "+r+"/other/f", false)
	for _, f := range []string{"/repo/a/f", "/repo/a/b/c/f"} {
		if b, err := os.ReadFile(r + f); err != nil || string(b) != "data\n" {
			t.Errorf("%s on the host: %q, %v", f, b, err)
		}
	}
	if b, _ := os.ReadFile(r + "/repo/a/b/f"); string(b) != "data\nx\n" {
		t.Errorf("repo/a/b/f on the host: %q", b)
	}
	// One revoke: the writes at every layer fail at the next open and the
	// denies mask nothing any more (the base view reads the host).
	revokeCounted(t, d, h, 1)
	for _, f := range []string{"/repo/f", "/repo/a/b/f", "/repo/a/b/c/d/f"} {
		wantSh(t, d, "write after the revoke: "+f, "echo x >> "+r+f, false)
	}
	wantSh(t, d, "read in /repo/a after the revoke (the deny is gone too)", "cat "+r+"/repo/a/f", true)
}

// TestFileScopeNestedCredentials: a broad grant with nesting inside it
// (read and write r, deny r/home, read and write r/home/u) still leaves the
// credential location r/home/u/.ssh denied (no admin policy names it) and
// the agent's own location closed; the nested layer works beside them. A
// second grant nesting the location under its own deny opens it only once
// its entry naming it carries an admin override (as the agent derives it
// when an admin policy names the path), and only for read.
func TestFileScopeNestedCredentials(t *testing.T) {
	d, r := fsSession(t)
	if err := os.MkdirAll(r+"/home/v", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r+"/home/v/f", []byte("data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fileGrant(t, d,
		backend.FileEntry{Path: r, Access: backend.FileRead},
		backend.FileEntry{Path: r, Access: backend.FileWrite},
		backend.FileEntry{Path: r + "/home", Access: backend.FileDeny},
		backend.FileEntry{Path: r + "/home/u", Access: backend.FileRead},
		backend.FileEntry{Path: r + "/home/u", Access: backend.FileWrite},
	)
	wantSh(t, d, "read beside the credential, in the nested layer", "cat "+r+"/home/u/notes", true)
	wantSh(t, d, "write beside the credential, in the nested layer", "echo x >> "+r+"/home/u/notes", true)
	wantSh(t, d, "read under the deny", "cat "+r+"/home/v/f", false)
	wantSh(t, d, "read a credential in the nested layer", "cat "+r+"/home/u/.ssh/id_ed25519", false)
	wantSh(t, d, "write a credential in the nested layer", "echo x > "+r+"/home/u/.ssh/authorized_keys", false)
	wantSh(t, d, "read the agent's own location", "cat "+r+"/secret/f", false)
	wantSh(t, d, "write in the outer layer", "echo x >> "+r+"/other/f", true)
	key := r + "/home/u/.ssh/id_ed25519"
	h := fileGrant(t, d,
		backend.FileEntry{Path: r + "/home", Access: backend.FileRead},
		backend.FileEntry{Path: r + "/home/u", Access: backend.FileDeny},
		backend.FileEntry{Path: r + "/home/u/.ssh", Access: backend.FileRead},
	)
	wantSh(t, d, "a nested grant naming the credential, no override", "cat "+key, false)
	if err := d.SetFileOverride("fs", backend.FileEntry{Path: r + "/home/u/.ssh", Access: backend.FileRead, Handle: h, Override: true}); err != nil {
		t.Fatal(err)
	}
	wantSh(t, d, "the nested grant with an override: read", "cat "+key, true)
	wantSh(t, d, "the nested grant with an override: write (read only)", "echo x >> "+key, false)
	wantSh(t, d, "the agent's own location beside the override", "cat "+r+"/secret/f", false)
}
