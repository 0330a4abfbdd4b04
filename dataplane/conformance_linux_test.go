package dataplane

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/backendtest"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// TestConformance runs the seam's conformance suite (the one the memory
// backend passes) against the real dataplane, as root: a private dataplane
// per subtest, uses made by real connects from a probe process inside the
// session, the denial reason read from the session's kernel counters.
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return newDataplane(t, testConfig(t)) },
		backendtest.WithUser(func(t *testing.T, b backend.Backend) backendtest.User {
			return &probeUser{t: t, d: b.(*Dataplane), procs: map[string]*probe.Proc{}}
		}),
		backendtest.WithFileUser(func(t *testing.T) backend.Backend {
			cfg := testConfig(t)
			cfg.Boundary = &boundary.Config{}
			return newDataplane(t, cfg)
		}, func(t *testing.T, b backend.Backend) backendtest.FileUser {
			return shellFiles{t: t, d: b.(*Dataplane)}
		}),
		backendtest.WithProcessUser(func(t *testing.T) backend.Backend {
			d, _ := procSessions(t)
			return d
		}, func(t *testing.T, b backend.Backend) backendtest.ProcessUser {
			return launchPrograms{d: b.(*Dataplane)}
		}))
}

// shellFiles opens files as a session process does: a shell launched in
// the session reads (cat) or appends to (>>) the file.
type shellFiles struct {
	t *testing.T
	d *Dataplane
}

func (u shellFiles) FileTree(t *testing.T, files ...string) string {
	for _, need := range []string{"/bin/sh", "/var/tmp"} {
		if _, err := os.Stat(need); err != nil {
			// The VM of .ci/vmtest has the test binary only (and BPF LSM:
			// TestFileScopeLSM checks fs.scope there with a probe process).
			t.Skipf("the shell file user needs %s: %v", need, err)
		}
	}
	root, err := os.MkdirTemp("/var/tmp", "shinken-conf-fs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func (u shellFiles) Open(session, path string, op backend.FileAccess) (bool, error) {
	script := "cat " + path + " >/dev/null"
	if op == backend.FileWrite {
		script = "echo x >> " + path
	}
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	if err := u.d.Launch(session, cmd, ProcOptions{}); err != nil {
		return false, err
	}
	return cmd.Wait() == nil, nil
}

// probeUser makes a use as a session process does: a TCP connect ("tcp")
// or a connected UDP send ("cudp") from a probe process in the session.
// Anything but EPERM is allowed (nothing listens: the peer refuses); an
// EPERM is denied, for the reason whose counter the denial moved.
type probeUser struct {
	t     *testing.T
	d     *Dataplane
	procs map[string]*probe.Proc
}

func (u *probeUser) Connect(session string, dst netip.AddrPort, proto backend.Proto) (backend.Reason, error) {
	s, err := u.d.Session(session)
	if err != nil {
		return 0, err
	}
	p := u.procs[session]
	if p == nil {
		p = startProbe(u.t, s, ProcOptions{})
		u.procs[session] = p
	}
	before, err := u.d.Counters(s.Index)
	if err != nil {
		return 0, err
	}
	cmd := "tcp "
	if proto == backend.ProtoUDP {
		cmd = "cudp "
	}
	if got := p.Do(cmd + dst.String()); got != "err EPERM" {
		return backend.ReasonNone, nil
	}
	after, err := u.d.Counters(s.Index)
	if err != nil {
		return 0, err
	}
	for r := range after {
		if after[r] > before[r] {
			return backend.Reason(r), nil
		}
	}
	u.t.Fatalf("connect %s from %s: EPERM, but no denial counter of the session moved", dst, session)
	return 0, nil
}
