package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dnsresolver"
)

// TestHostAddrNeverKernel: testHostAddrNever with real connects, and the
// host's addresses fed the way the daemon feeds them (the resolver's netlink
// watcher, dnsresolver.WatchHostAddrs, into SetHostAddrs): the test adds an
// address to a dummy link it creates in the host's namespace, and removes
// both at the end.
func TestHostAddrNeverKernel(t *testing.T) {
	d, _ := newKernel(t)
	name := fmt.Sprintf("shkha%d", os.Getpid()%100000)
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		t.Fatalf("add bridge link %s: %v", name, err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(link) })
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("198.18.77.1") // benchmarking range: on no real network
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	listener := listenTCP(t, "198.18.77.1:0")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var hosts *dnsresolver.HostAddrs
	set := func(t *testing.T, a *Agent, add bool) {
		if hosts == nil {
			hosts = &dnsresolver.HostAddrs{}
			hosts.OnChange(func(addrs []netip.Addr) {
				if err := a.SetHostAddrs(addrs); err != nil {
					t.Errorf("SetHostAddrs: %v", err)
				}
			})
			if err := dnsresolver.WatchHostAddrs(ctx, hosts); err != nil {
				t.Fatal(err)
			}
		}
		if add {
			if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
				t.Fatal(err)
			}
		} else if err := netlink.AddrDel(link, addr); err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(3 * time.Second); agentNeverHas(a, ip) != add; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("never-list holds %s: %v 3 s after the address was %s", ip, !add, map[bool]string{true: "added", false: "removed"}[add])
			}
		}
		if agentNeverHas(a, netip.MustParseAddr("127.0.0.1")) {
			t.Fatal("127.0.0.1 is on the never-list as a host address")
		}
	}
	// Once removed, the address is no longer local: a connect to it would
	// leave the host, so reach is not asked then, only the never-list.
	testHostAddrNever(t, d, probeReach(d), listener, set, false)
}
