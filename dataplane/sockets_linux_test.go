package dataplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestSocketGrant (issue 22, build item 5) through the dataplane and the
// real launcher: a 0666 socket a host process listens on in /run is
// unreachable from a fresh session until an fs.scope connect entry names
// it, reachable under the grant, unreachable after its revoke (one handle
// write, the view swept before Revoke returns); a container runtime
// socket is refused whatever the grant (ErrSocketBlocked), and so are a
// credential location, a socket outside /run, a path reached through
// /var/run's link and a path that is not a socket; bad input changes
// nothing.
func TestSocketGrant(t *testing.T) {
	d, r := fsSession(t)
	if !kerneltest.HaveProgram(t, "python3") {
		t.Skip("no /usr/bin/python3 to connect with inside the session")
	}
	dir := fmt.Sprintf("/run/shinken-sock-test-%d", os.Getpid())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := dir + "/app.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	os.Chmod(sock, 0o666)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	connect := `python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.recv(8).decode())' ` + sock
	wantSh(t, d, "connect to a host 0666 socket in /run before any grant", connect, false)
	h := fileGrant(t, d, backend.FileEntry{Path: sock, Access: backend.FileConnect})
	if ok, out := sh(t, d, connect); !ok || out != "hello" {
		t.Errorf("connect under the grant: ok=%v %q", ok, out)
	} else {
		t.Logf("verified: connect under the grant reaches the host listener")
	}
	revokeCounted(t, d, h, 1)
	wantSh(t, d, "connect after the revoke", connect, false)

	// Block tier and bad input: refused whatever the grant, nothing
	// changes.
	regular := dir + "/plain"
	if err := os.WriteFile(regular, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path  string
		block bool
	}{
		{"/run/containerd/containerd.sock", true},
		{"/run/docker.sock", true},
		{"/var/run/docker.sock", true},
		{"/run/crio/crio.sock", true},
		{"/run/podman/podman.sock", true},
		{"/run/user/0/bus", true},
		{r + "/home/u/.ssh/agent.sock", false}, // outside /run
		{"/var/run/" + filepath.Base(dir) + "/app.sock", false},
		{dir, false},     // a directory, not a socket
		{regular, false}, // a regular file
	} {
		h, _ := d.NewHandle(HandleRef{}, time.Time{})
		err := d.Apply("fs", backend.Delta{Files: []backend.FileEntry{{Path: c.path, Access: backend.FileConnect, Handle: h}}})
		switch {
		case err == nil:
			t.Errorf("connect %s: applied", c.path)
		case c.block != errors.Is(err, backend.ErrSocketBlocked):
			t.Errorf("connect %s: %v (want blocked=%v)", c.path, err, c.block)
		default:
			t.Logf("verified: connect %s refused: %v", c.path, err)
		}
	}
	if snap, _ := d.Snapshot(); len(snap.Deltas["fs"].Files) != 1 {
		t.Errorf("refused entries in the snapshot: %v", snap.Deltas["fs"].Files)
	}
	wantSh(t, d, "connect after the refused grants", connect, false)
	if ok, out := sh(t, d, "ls -A /run"); !ok || strings.Contains(out, "containerd") || strings.Contains(out, "docker") {
		t.Errorf("the session's /run after the refused grants: %q", out)
	}
}
