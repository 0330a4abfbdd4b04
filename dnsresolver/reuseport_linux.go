package dnsresolver

import (
	"errors"
	"net/netip"
)

// udpGroup is the resolver's UDP sockets: Config.UDPSockets sockets bound
// to the same address with SO_REUSEPORT, and one more, the penalty socket,
// each read by its own workers. A BPF program attached to the group
// (steer_linux.go) steers each datagram by its destination address, the
// session address: a session in the penalty box (penalty.go) to the
// penalty socket, up to its query rate, and the rest to a sink that is
// never read; every other session to socket (address mod UDPSockets). A
// session's queries therefore all reach one socket, and a flood fills that
// socket's queue only: once the flooder is in the box, what the agent reads
// of it is bounded by its rate. Without the program (attach failed: logged),
// the kernel spreads datagrams over the sockets by a hash of addresses and
// ports, and only the token buckets protect one session from another.
//
// Only sockets of the same effective uid can join a reuseport group, so a
// session (its own uid) cannot bind into it; and the port is first taken
// by a plain socket (see listenUDPGroup), so the group never joins another
// process's.
type udpGroup struct {
	socks    []*udpSocket // socks[len-1] is the penalty socket
	port     uint16
	addr     netip.AddrPort
	steering *steering // the attached program; set once by attachSteering, before serve
}

// penaltySocket is the index of the penalty socket.
func (g *udpGroup) penaltySocket() int { return len(g.socks) - 1 }

func listenUDPGroup(addr netip.AddrPort, n int) (*udpGroup, error) {
	// The port must be free: a plain socket (no SO_REUSEPORT) binds it
	// only then, and picks a free one for port 0. The group binds it as
	// soon as the probe lets go.
	probe, err := listenUDP(addr, false)
	if err != nil {
		return nil, err
	}
	port := probe.port
	probe.close()
	g := &udpGroup{port: port, addr: netip.AddrPortFrom(addr.Addr(), port)}
	for range n + 1 {
		u, err := listenUDP(g.addr, true)
		if err != nil {
			g.close()
			return nil, err
		}
		g.socks = append(g.socks, u)
	}
	return g, nil
}

func (g *udpGroup) shutdown() {
	for _, u := range g.socks {
		u.shutdown()
	}
}

func (g *udpGroup) close() error {
	var errs []error
	for _, u := range g.socks {
		errs = append(errs, u.close())
	}
	if g.steering != nil {
		errs = append(errs, g.steering.close())
	}
	return errors.Join(errs...)
}

// serve starts the workers: workers per socket, one on the penalty socket;
// it returns how many it started.
func (g *udpGroup) serve(r *Resolver, workers int) int {
	started := 0
	for i, u := range g.socks {
		n := workers
		if i == g.penaltySocket() {
			n = 1
		}
		for range n {
			r.udpWG.Go(func() { u.serve(r) })
		}
		started += n
	}
	return started
}

// received counts the datagrams each socket read (tests).
func (g *udpGroup) received() []uint64 {
	out := make([]uint64, len(g.socks))
	for i, u := range g.socks {
		out[i] = u.received.Load()
	}
	return out
}
