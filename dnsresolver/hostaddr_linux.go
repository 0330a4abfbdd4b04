package dnsresolver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// WatchHostAddrs fills h with every address of the network namespace of the
// calling thread (the host's, for the agent) and keeps it current until ctx
// is done, from netlink address updates (github.com/vishvananda/netlink
// AddrSubscribeWithOptions): it subscribes first, then lists, then applies
// the updates in order, so no change between the two is missed. If the
// subscription fails (a lost update: the socket's buffer overran), it
// subscribes and lists again. It returns once the first listing is in h,
// or the error that kept it from being made.
func WatchHostAddrs(ctx context.Context, h *HostAddrs) error {
	ns, err := netns.Get()
	if err != nil {
		return fmt.Errorf("dnsresolver: host addresses: %w", err)
	}
	w := &hostWatch{ns: ns, h: h}
	sub, err := w.sync()
	if err != nil {
		ns.Close()
		return err
	}
	go w.loop(ctx, sub)
	return nil
}

type hostWatch struct {
	ns netns.NsHandle
	h  *HostAddrs
	// on: each address and the links that hold it (one address may be on
	// several interfaces: it stays a host address until the last goes).
	on map[netip.Addr]map[int]bool
}

// hostSub is one subscription: close done to end it; ch is closed after.
type hostSub struct {
	ch   chan netlink.AddrUpdate
	done chan struct{}
}

func (s *hostSub) stop() {
	close(s.done)
	for range s.ch { // the subscription's goroutine may be sending: drain
	}
}

// sync subscribes, then lists the addresses into h.
func (w *hostWatch) sync() (*hostSub, error) {
	s := &hostSub{ch: make(chan netlink.AddrUpdate, 1024), done: make(chan struct{})}
	// The sockets are made in the watched namespace: on this thread when it
	// is already there (entering a namespace needs CAP_SYS_ADMIN, which a
	// resolver run without root lacks), else by entering it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	opts := netlink.AddrSubscribeOptions{ReceiveBufferSize: 1 << 20}
	newHandle := func() (*netlink.Handle, error) { return netlink.NewHandle(unix.NETLINK_ROUTE) }
	if cur, err := netns.Get(); err != nil || !cur.Equal(w.ns) {
		opts.Namespace = &w.ns
		newHandle = func() (*netlink.Handle, error) { return netlink.NewHandleAt(w.ns, unix.NETLINK_ROUTE) }
		if err == nil {
			cur.Close()
		}
	} else {
		cur.Close()
	}
	if err := netlink.AddrSubscribeWithOptions(s.ch, s.done, opts); err != nil {
		return nil, fmt.Errorf("dnsresolver: host addresses: subscribe: %w", err)
	}
	nh, err := newHandle()
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("dnsresolver: host addresses: %w", err)
	}
	defer nh.Close()
	var list []netlink.Addr
	for try := 0; ; try++ {
		list, err = nh.AddrList(nil, netlink.FAMILY_ALL)
		if err == nil || !errors.Is(err, netlink.ErrDumpInterrupted) || try == 10 {
			break
		}
	}
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("dnsresolver: host addresses: list: %w", err)
	}
	w.on = map[netip.Addr]map[int]bool{}
	addrs := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			ip = hostKey(ip)
			w.mark(ip, a.LinkIndex, true)
			addrs = append(addrs, ip)
		}
	}
	w.h.Set(addrs)
	return s, nil
}

// mark records that link holds (or no longer holds) ip, and reports
// whether any link holds it now.
func (w *hostWatch) mark(ip netip.Addr, link int, on bool) bool {
	links := w.on[ip]
	if on {
		if links == nil {
			links = map[int]bool{}
			w.on[ip] = links
		}
		links[link] = true
		return true
	}
	delete(links, link)
	if len(links) == 0 {
		delete(w.on, ip)
		return false
	}
	return true
}

func (w *hostWatch) loop(ctx context.Context, s *hostSub) {
	defer w.ns.Close()
	for {
		select {
		case <-ctx.Done():
			s.stop()
			return
		case u, ok := <-s.ch:
			if ok {
				if ip, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok {
					ip = hostKey(ip)
					if w.mark(ip, u.LinkIndex, u.NewAddr) {
						w.h.Add(ip)
					} else {
						w.h.Remove(ip)
					}
				}
				continue
			}
			close(s.done) // ends the library's goroutine waiting on it
		}
		// The subscription ended (an error): subscribe and list again,
		// keeping the set as it was meanwhile.
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			var err error
			if s, err = w.sync(); err == nil {
				break
			}
		}
	}
}
