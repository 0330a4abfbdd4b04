package dataplane

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// TestAdoption: programs and maps keep enforcing after the loader process
// exits, and a new loader adopts them (atomic program replacement on the
// pinned links) with no window where a denied destination is reachable.
func TestAdoption(t *testing.T) {
	kerneltest.RequireRoot(t)
	cfg := testConfig(t)
	allowed := listenTCP(t, "127.0.0.2:0")
	denied := listenTCP(t, "127.0.0.3:0")

	loader := exec.Command(probe.Binary(t))
	loader.Env = []string{loaderEnv + "=1", "SHINKEN_TEST_PARENT=" + cfg.Parent, "SHINKEN_TEST_PIN=" + cfg.PinPath,
		"SHINKEN_TEST_ALLOW=" + allowed.addr()}
	out, err := loader.CombinedOutput()
	// Whatever happened, remove what the loader left once the test ends.
	t.Cleanup(func() {
		cfg2 := loaderConfig2(cfg)
		if d, err := Open(cfg2); err == nil {
			d.Uninstall()
		}
	})
	if err != nil {
		t.Fatalf("loader: %v: %s", err, out)
	}

	root, _ := FindCgroup2Mount()
	sess := Session{Name: "ad", Path: filepath.Join(root, cfg.Parent, "ad")}
	p := startProbe(t, sess, ProcOptions{})
	// No loader process is alive now: the kernel enforces on its own.
	if got := p.Do("tcp " + allowed.addr()); got != "ok" {
		t.Fatalf("allowed with no agent running: %s", got)
	}
	if got := p.Do("tcp " + denied.addr()); got != "err EPERM" {
		t.Fatalf("denied with no agent running: %s", got)
	}

	// Hammer both destinations from inside the session while a new loader
	// adopts the pinned dataplane.
	hd := startProbe(t, sess, ProcOptions{})
	ha := startProbe(t, sess, ProcOptions{})
	resD := make(chan string, 1)
	resA := make(chan string, 1)
	go func() { resD <- hd.DoAsync("hammer " + denied.addr() + " 1.5") }()
	go func() { resA <- ha.DoAsync("hammer " + allowed.addr() + " 1.5") }()
	d, err := Open(loaderConfig2(cfg))
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	defer d.Close()
	if !d.Adopted() {
		t.Errorf("Open did not report adopting the pinned dataplane")
	}
	gotD, gotA := <-resD, <-resA
	var okD, failD, okA, failA int
	fmt.Sscanf(gotD, "ok %d %d", &okD, &failD)
	fmt.Sscanf(gotA, "ok %d %d", &okA, &failA)
	t.Logf("during adoption: denied dst %d ok / %d refused; allowed dst %d ok / %d refused", okD, failD, okA, failA)
	if !strings.HasPrefix(gotD, "ok ") || okD != 0 || failD == 0 {
		t.Errorf("denied destination during adoption: %s (want 0 successes)", gotD)
	}
	if !strings.HasPrefix(gotA, "ok ") || failA != 0 || okA == 0 {
		t.Errorf("allowed destination during adoption: %s (want 0 failures)", gotA)
	}

	// The adopted dataplane knows the session and its rule.
	s, err := d.Session("ad")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := d.EgressRules("ad")
	if err != nil || len(rules) != 1 {
		t.Fatalf("rules after adoption: %v %v", rules, err)
	}
	if err := d.Revoke(rules[0].Handle); err != nil {
		t.Fatal(err)
	}
	if got := p.Do("tcp " + allowed.addr()); got != "err EPERM" {
		t.Errorf("revoke through the adopted dataplane: %s", got)
	}
	// A new handle must not collide with the adopted one.
	h2 := mustHandle(t, d, HandleRef{}, zeroTime)
	if h2.Slot == rules[0].Handle.Slot && h2.Generation == rules[0].Handle.Generation {
		t.Errorf("new handle %s repeats an adopted one", h2)
	}
	s2, err := d.CreateSession("ad2", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if s2.Index == s.Index {
		t.Errorf("new session reuses the adopted session's index %d", s.Index)
	}
	// Attached exactly once per hook: adoption replaced, never added.
	n, err := d.attachedPrograms()
	if err != nil {
		t.Fatal(err)
	}
	if want := hooksIn(d.FlowMode()); n != want {
		t.Errorf("%d programs attached at the parent after adoption, want %d", n, want)
	}
	_ = os.Getpid
}

func loaderConfig2(cfg Config) Config {
	return Config{Parent: cfg.Parent, PinPath: cfg.PinPath, MaxSessions: 1024, MaxHandles: 4096, MaxEgress4: 1 << 16, MaxEgress6: 1 << 16}
}

// TestAdoptOtherMode: an agent adopting a dataplane pinned by one running the
// other flow mode ends with exactly its own mode's hooks attached, enforcing
// throughout, and its sessions and grants intact.
func TestAdoptOtherMode(t *testing.T) {
	modes := flowModes(t)
	if len(modes) < 2 {
		t.Skip("only packet mode runs on this kernel")
	}
	cfg := testConfig(t)
	srv := listenTCP(t, "127.0.0.2:0")
	for i, m := range []FlowMode{FlowPacket, FlowSweep, FlowPacket} {
		c := cfg
		c.FlowMode = m
		d, err := Open(c)
		if err != nil {
			t.Fatalf("open in %s mode: %v", m, err)
		}
		if i == 0 {
			t.Cleanup(func() { Remove(cfg) })
			if _, err := d.CreateSession("am", Limits{}); err != nil {
				t.Fatal(err)
			}
			h := mustHandle(t, d, HandleRef{}, time.Time{})
			mustAllow(t, d, "am", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: h})
		}
		n, err := d.attachedPrograms()
		if err != nil {
			t.Fatal(err)
		}
		if want := hooksIn(m); n != want {
			t.Errorf("%s mode after adoption: %d programs attached, want %d", m, n, want)
		}
		s, err := d.Session("am")
		if err != nil {
			t.Fatalf("%s mode: session lost: %v", m, err)
		}
		p := startProbe(t, s, ProcOptions{})
		if got := p.Do("tcp " + srv.addr()); got != "ok" {
			t.Errorf("%s mode: granted connect: %s", m, got)
		}
		if got := p.Do("tcp 127.0.0.3:9"); got != "err EPERM" {
			t.Errorf("%s mode: denied connect: %s", m, got)
		}
		p.Stop()
		d.Close()
	}
}
