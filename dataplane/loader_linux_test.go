package dataplane

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

const loaderEnv = "SHINKEN_TEST_LOADER"

func loaderConfig() Config {
	return Config{Parent: os.Getenv("SHINKEN_TEST_PARENT"), PinPath: os.Getenv("SHINKEN_TEST_PIN"),
		MaxSessions: 1024, MaxHandles: 4096, MaxEgress4: 1 << 16, MaxEgress6: 1 << 16}
}

// loaderMain is a stand-in agent process for the adoption test: it loads the
// dataplane, creates session "ad" allowed to reach SHINKEN_TEST_ALLOW, and
// exits without uninstalling.
func loaderMain() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "loader:", err)
		os.Exit(1)
	}
	d, err := Open(loaderConfig())
	if err != nil {
		fail(err)
	}
	if _, err := d.CreateSession("ad", Limits{}); err != nil {
		fail(err)
	}
	h, err := d.NewHandle(HandleRef{}, time.Time{})
	if err != nil {
		fail(err)
	}
	ap := netip.MustParseAddrPort(os.Getenv("SHINKEN_TEST_ALLOW"))
	if err := d.AllowEgress("ad", EgressRule{Prefix: netip.PrefixFrom(ap.Addr(), 32), Proto: ProtoTCP, Ports: Port(ap.Port()), Handle: h}); err != nil {
		fail(err)
	}
	d.Close()
	os.Exit(0)
}

// TestOpenFailureLeavesNothing: an Open that fails after some maps were
// pinned (here an LRU map too large to allocate) removes the pin directory
// and the parent cgroup it created.
func TestOpenFailureLeavesNothing(t *testing.T) {
	kerneltest.RequireRoot(t)
	cfg := testConfig(t)
	cfg.MaxFlows = 1 << 30
	d, err := Open(cfg)
	if err == nil {
		d.Uninstall()
		t.Skip("the kernel allocated a 2^30-entry LRU map: no failure to test")
	}
	if _, serr := os.Stat(cfg.PinPath); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("pin path %s left behind after a failed Open (%v): %v", cfg.PinPath, err, serr)
		os.RemoveAll(cfg.PinPath)
	}
	root, _ := FindCgroup2Mount()
	if _, serr := os.Stat(filepath.Join(root, cfg.Parent)); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("parent cgroup left behind after a failed Open: %v", serr)
	}
}
