package api

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestListenLeavesSharedDirectories: the API socket's own directory (made
// by Listen, or holding nothing but a stale socket) becomes 0750 root and
// the operator group; a shared directory (holding anything else, as /tmp
// or /run do) keeps its owner and mode (Listen once made /tmp 0750 root,
// locking every other user out of it), and a shared directory others may
// write to without the sticky bit is refused with nothing made. The
// socket is 0660 root and the operator group in every case it is made.
func TestListenLeavesSharedDirectories(t *testing.T) {
	kerneltest.RequireRoot(t)
	const gid = 4242
	base := t.TempDir()
	mkdir := func(name string, mode os.FileMode, uid, gid int, files ...string) string {
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(d, f), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	owner := func(p string) (os.FileMode, uint32, uint32) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return fi.Mode() & (os.ModePerm | os.ModeSticky), st.Uid, st.Gid
	}
	for _, c := range []struct {
		name    string
		dir     string
		wantDir [3]uint32 // mode, uid, gid of the directory after
		refused string
	}{
		{name: "made", dir: filepath.Join(base, "new", "run"), wantDir: [3]uint32{0o750, 0, gid}},
		{name: "own, a stale socket", dir: mkdir("own", 0o755, 0, 0, "agent.sock"), wantDir: [3]uint32{0o750, 0, gid}},
		{name: "shared", dir: mkdir("shared", 0o755, 1234, 1234, "other"), wantDir: [3]uint32{0o755, 1234, 1234}},
		{name: "shared sticky", dir: mkdir("sticky", 0o777|os.ModeSticky, 0, 0, "other"), wantDir: [3]uint32{uint32(0o777 | os.ModeSticky), 0, 0}},
		{name: "shared writable", dir: mkdir("writable", 0o777, 0, 0, "other"), wantDir: [3]uint32{0o777, 0, 0}, refused: "without the sticky bit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := filepath.Join(c.dir, "agent.sock")
			ln, err := Listen(sock, gid)
			if c.refused != "" {
				if err == nil || !strings.Contains(err.Error(), c.refused) {
					t.Fatalf("Listen: %v, want an error saying %q", err, c.refused)
				}
				if _, err := os.Lstat(sock); err == nil {
					t.Errorf("a refused Listen made %s", sock)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				if m, uid, g := owner(sock); m&os.ModePerm != 0o660 || uid != 0 || g != gid {
					t.Errorf("socket %v %d:%d, want 0660 0:%d", m, uid, g, gid)
				}
			}
			m, uid, g := owner(c.dir)
			if got := [3]uint32{uint32(m), uid, g}; got != c.wantDir {
				t.Errorf("directory %v %d:%d, want %v %d:%d", m, uid, g, os.FileMode(c.wantDir[0]), c.wantDir[1], c.wantDir[2])
			}
		})
	}
}
