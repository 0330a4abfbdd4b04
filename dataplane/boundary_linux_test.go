package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// TestBoundaryThroughDataplane: with the session boundary on, processes
// launched through the dataplane run as the session's own uid, in its
// namespaces, and egress enforcement works exactly as without it (denied,
// granted, revoked); the uid and namespaces survive an agent restart
// (adoption), and an index (so a uid) is handed out again only after its
// session was destroyed.
func TestBoundaryThroughDataplane(t *testing.T) {
	kerneltest.RequireRoot(t)
	for _, f := range []string{boundary.DefaultCatatonit, "/bin/bash"} {
		if _, err := os.Stat(f); err != nil {
			// The test VM's initrd holds the test binary alone; on a host
			// the boundary's own tests fail without catatonit.
			t.Skipf("no %s here (the boundary is tested on the host): %v", f, err)
		}
	}
	cfg := testConfig(t)
	cfg.Boundary = &boundary.Config{Accept: boundaryAccept(t)}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Probe().Boundary {
		t.Logf("boundary: %-26s %s: %s %s", s.Class, s.Level, s.Mechanism, s.Reason)
		if !s.Level.Enforceable() {
			t.Errorf("%s unavailable on this host: %s", s.Class, s.Reason)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	run := func(d *Dataplane, name string) string {
		t.Helper()
		cmd := exec.Command("/bin/bash", "-c", fmt.Sprintf("id -u; readlink /proc/self/ns/mnt; exec 3<>/dev/tcp/127.0.0.1/%d && echo connected", port))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &out, "/"
		if err := d.Launch(name, cmd, ProcOptions{}); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		return out.String()
	}
	a, err := d.CreateSession("bnd-a", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.CreateSession("bnd-b", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	uidA := fmt.Sprint(boundary.DefaultUIDBase + a.Index)
	out := run(d, "bnd-a")
	if !strings.HasPrefix(out, uidA+"\n") || strings.Contains(out, "connected") {
		t.Fatalf("no grant: %q (want uid %s, connect refused)", out, uidA)
	}
	mntA := strings.Fields(out)[1]
	if outB := run(d, "bnd-b"); strings.HasPrefix(outB, uidA+"\n") || strings.Fields(outB)[1] == mntA {
		t.Fatalf("sessions a and b share a uid or mount namespace: %q %q", out, outB)
	}
	h, err := d.NewHandle(HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	rule := EgressRule{Prefix: netip.MustParsePrefix("127.0.0.1/32"), Proto: ProtoTCP, Ports: Port(uint16(port)), Handle: h}
	if err := d.AllowEgress("bnd-a", rule); err != nil {
		t.Fatal(err)
	}
	if out := run(d, "bnd-a"); !strings.Contains(out, "connected") {
		t.Fatalf("granted: %q", out)
	}
	if out := run(d, "bnd-b"); strings.Contains(out, "connected") {
		t.Fatalf("a's grant reached b: %q", out)
	}
	if err := d.Revoke(h); err != nil {
		t.Fatal(err)
	}
	if out := run(d, "bnd-a"); strings.Contains(out, "connected") {
		t.Fatalf("revoked: %q", out)
	}
	t.Logf("verified: through the launcher (uid %s, own namespaces) connect is refused, then allowed by a grant, then refused after its revoke; b never gets a's grant", uidA)

	// Restart: a new dataplane adopts the pinned one and the sessions'
	// holders.
	d.Close()
	d2 := newDataplane(t, cfg)
	out = run(d2, "bnd-a")
	if f := strings.Fields(out); len(f) < 2 || f[0] != uidA || f[1] != mntA {
		t.Fatalf("after adoption: %q, want uid %s in %s", out, uidA, mntA)
	}
	t.Logf("verified: after adoption session a keeps uid %s and mount namespace %s", uidA, mntA)

	// Release: the index (so the uid) comes back only after destroy, with
	// nothing of the old session (namespace inode numbers are reused, so
	// compare contents: a's /tmp).
	mark := exec.Command("/bin/sh", "-c", "touch /tmp/left-by-a")
	mark.Dir = "/"
	if err := d2.Launch("bnd-a", mark, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	mark.Wait()
	if err := d2.DestroySession("bnd-a"); err != nil {
		t.Fatal(err)
	}
	c, err := d2.CreateSession("bnd-c", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Index != a.Index {
		t.Logf("note: index %d not reused (got %d)", a.Index, c.Index)
	}
	look := exec.Command("/bin/ls", "-A", "/tmp", "/tmp/home") // the session user's home, fresh
	var lookOut strings.Builder
	look.Stdout, look.Dir = &lookOut, "/"
	if err := d2.Launch("bnd-c", look, ProcOptions{}); err != nil {
		t.Fatal(err)
	}
	look.Wait()
	if lookOut.String() != "/tmp:\nhome\n\n/tmp/home:\n" {
		t.Fatalf("a new session sees %q in /tmp", lookOut.String())
	}
	t.Logf("verified: index %d (uid %s) handed out again only after its session was destroyed, with fresh namespaces", c.Index, fmt.Sprint(boundary.DefaultUIDBase+c.Index))
}

// TestLaunchIdentityNoBoundary: without the session boundary (tests of the
// hooks alone) Launch still names no identity but the sessions' shared
// nobody, and never leaves the root group by omission.
func TestLaunchIdentityNoBoundary(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	if _, err := d.CreateSession("nobnd", Limits{}); err != nil {
		t.Fatal(err)
	}
	for _, opts := range []ProcOptions{{UID: 1000}, {UID: Nobody, GID: 42}, {GID: 0xFFFFFFFF}} {
		cmd := exec.Command(probe.Binary(t))
		cmd.Env = []string{probe.EnvVar + "=1"}
		err := d.Launch("nobnd", cmd, opts)
		if err == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if !errors.Is(err, boundary.ErrIdentity) {
			t.Errorf("uid %d gid %d: %v, want ErrIdentity", opts.UID, opts.GID, err)
		}
	}
	want := fmt.Sprintf("ok %d %d ", Nobody, Nobody) // no supplementary group
	for _, opts := range []ProcOptions{{}, {UID: Nobody}} {
		p := probe.Start(t, func(c *exec.Cmd) error { return d.Launch("nobnd", c, opts) })
		if got := p.Do("ids"); got != want {
			t.Errorf("uid %d gid %d: runs as %q, want %q", opts.UID, opts.GID, got, want)
		}
	}
}
