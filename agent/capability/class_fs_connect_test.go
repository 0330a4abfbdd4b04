package capability

import (
	"errors"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFSConnect: fs.scope connect[] names sockets exactly: Ask tier, Block
// for a container runtime's socket (a manifest cannot lower it), allows
// connect to the named socket only, compiles to FileConnect entries, and
// a connect outside a bound widens it.
func TestFSConnect(t *testing.T) {
	c := Capability{Class: ClassFSScope, FS: &FSScope{Connect: []string{"/run/app.sock"}}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	auto := TierAuto
	if got := EffectiveTier(c, TierContext{Workspace: "/run"}, nil, "", Ingredients{}); got != TierAsk {
		t.Errorf("connect /run/app.sock: tier %s, want ask", got)
	}
	for _, p := range []string{"/run/docker.sock", "/var/run/docker.sock", "/run/containerd/containerd.sock", "/run/crio/crio.sock", "/run/podman/podman.sock"} {
		b := Capability{Class: ClassFSScope, FS: &FSScope{Connect: []string{"/run/app.sock", p}}}
		if got := EffectiveTier(b, TierContext{}, &auto, "", Ingredients{}); got != TierBlock {
			t.Errorf("connect %s with a manifest saying auto: tier %s, want block", p, got)
		}
	}
	if !c.Allows(UseRequest{Class: ClassFSScope, Op: "connect", Path: "/run/app.sock"}) || c.Allows(UseRequest{Class: ClassFSScope, Op: "connect", Path: "/run/app.sock/x"}) || c.Allows(UseRequest{Class: ClassFSScope, Op: "connect", Path: "/run/other.sock"}) || c.Allows(UseRequest{Class: ClassFSScope, Op: "read", Path: "/run/app.sock"}) {
		t.Errorf("connect allows more or less than the named socket")
	}
	d := Compile(c, backend.HandleRef{Slot: 3, Generation: 1})
	if len(d.Files) != 1 || d.Files[0].Access != backend.FileConnect || d.Files[0].Path != "/run/app.sock" {
		t.Errorf("compiled: %v", d.Files)
	}
	bound := Capability{Class: ClassFSScope, FS: &FSScope{Connect: []string{"/run"}}}
	if err := c.Within(bound); !errors.Is(err, ErrWidens) {
		t.Errorf("connect /run/app.sock within connect /run: %v, want a widening (sockets are named exactly)", err)
	}
}
