package dnsresolver

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestWatchHostAddrs: in a network namespace of its own, the watcher lists
// the addresses there and follows their changes (netlink address updates):
// added, on a second interface too, removed from one and then the other.
// And a resolver without Config.HostAddrs knows the host's loopback
// address once started.
func TestWatchHostAddrs(t *testing.T) {
	h := NewHostAddrs()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	steps := make(chan func() error)
	go func() {
		// This thread enters a new network namespace and is never used
		// again (the goroutine ends locked, so the runtime discards it).
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err == nil {
			err = WatchHostAddrs(ctx, h)
		}
		errc <- err
		for f := range steps {
			errc <- f()
		}
	}()
	if err := <-errc; errors.Is(err, unix.EPERM) {
		t.Skip("no network namespace:", err)
	} else if err != nil {
		t.Fatal(err)
	}
	defer close(steps)
	do := func(f func() error) {
		t.Helper()
		steps <- f
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	wait := func(a string, want bool) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); h.Contains(netip.MustParseAddr(a)) != want; {
			if time.Now().After(deadline) {
				t.Fatalf("%s held %v, want %v; set %v", a, !want, want, h.Addrs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait("127.0.0.1", true)
	wait("::1", true)
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("198.51.100.9"), Mask: net.CIDRMask(24, 32)}}
	var veth netlink.Link = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "shk0"}, PeerName: "shk1"}
	do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, addr)
	})
	wait("198.51.100.9", true)
	do(func() error {
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		return netlink.AddrAdd(veth, addr)
	})
	do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrDel(lo, addr)
	})
	time.Sleep(100 * time.Millisecond)
	wait("198.51.100.9", true) // still on shk0 (a veth of its own)
	do(func() error { return netlink.AddrDel(veth, addr) })
	wait("198.51.100.9", false)

	// The resolver's own watcher, in the test's namespace (the host's).
	e := newTestEnv(t, nil)
	if !e.r.host.Contains(netip.MustParseAddr("127.0.0.1")) {
		t.Fatalf("resolver's host addresses %v", e.r.host.Addrs())
	}
}
