package dnsresolver

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// udpGroup is the resolver's UDP sockets: Config.UDPSockets sockets bound
// to the same address with SO_REUSEPORT, and one more, the penalty socket,
// each read by its own workers. A classic BPF program attached to the
// group (SO_ATTACH_REUSEPORT_CBPF) steers each datagram by its destination
// address, the session address: a session in the penalty box (penalty.go)
// to the penalty socket, every other session to socket (address mod
// UDPSockets). A session's queries therefore all reach one socket, and a
// flood fills that socket's queue only: once the flooder is in the box, its
// queue is the penalty socket's, shared with other flooders only. Without
// the program (attach failed: logged), the kernel spreads datagrams over the
// sockets by a hash of addresses and ports, and only the token buckets
// protect one session from another.
//
// Only sockets of the same effective uid can join a reuseport group, so a
// session (its own uid) cannot bind into it; and the port is first taken
// by a plain socket (see listenUDPGroup), so the group never joins another
// process's.
type udpGroup struct {
	socks   []*udpSocket // socks[len-1] is the penalty socket
	port    uint16
	steered atomic.Bool // the program is attached
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
	g := &udpGroup{port: port}
	for range n + 1 {
		u, err := listenUDP(netip.AddrPortFrom(addr.Addr(), port), true)
		if err != nil {
			g.close()
			return nil, err
		}
		g.socks = append(g.socks, u)
	}
	return g, nil
}

// steerProgram is the group's program: the destination address of the
// datagram (the network header is at SKF_NET_OFF; the program otherwise
// sees the UDP payload) selects the socket.
func steerProgram(n int, penalised []uint32) ([]bpf.RawInstruction, error) {
	const skfNetOff = 0xfff00000 // SKF_NET_OFF, -0x100000 as the kernel's u32
	prog := []bpf.Instruction{bpf.LoadAbsolute{Off: skfNetOff + 16, Size: 4}}
	for i, idx := range penalised {
		// Jump to the last instruction (ret penalty) on a match.
		skip := len(penalised) - i + 1
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: sessionBase + idx, SkipTrue: uint8(skip)})
	}
	prog = append(prog,
		bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)},
		bpf.RetA{},
		bpf.RetConstant{Val: uint32(n)},
	)
	return bpf.Assemble(prog)
}

// steer attaches the program for the sessions in the penalty box (at most
// maxPenalised, so every jump fits in 8 bits).
func (g *udpGroup) steer(penalised []uint32) error {
	raw, err := steerProgram(len(g.socks)-1, penalised)
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, ins := range raw {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.SetsockoptSockFprog(g.socks[0].fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &prog); err != nil {
		return fmt.Errorf("SO_ATTACH_REUSEPORT_CBPF: %w", err)
	}
	g.steered.Store(true)
	return nil
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
	return errors.Join(errs...)
}

// serve starts the workers: workers per socket, one on the penalty socket.
func (g *udpGroup) serve(r *Resolver, workers int) {
	for i, u := range g.socks {
		n := workers
		if i == g.penaltySocket() {
			n = 1
		}
		for range n {
			r.udpWG.Go(func() { u.serve(r) })
		}
	}
}

// received counts the datagrams each socket read (tests).
func (g *udpGroup) received() []uint64 {
	out := make([]uint64, len(g.socks))
	for i, u := range g.socks {
		out[i] = u.received.Load()
	}
	return out
}
