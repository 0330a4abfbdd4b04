package dnsresolver

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// udpSocket is one of the resolver's UDP sockets on Linux (udpGroup): a
// plain blocking socket read by Config.UDPWorkers goroutines (one by
// default), each parked in recvmmsg(2) on its own thread as a C resolver
// would, so a query costs one wake-up and no netpoller round trip (measured
// on the bench host: about a third less CPU per query than a net.UDPConn). IP_PKTINFO gives each
// datagram's destination address, and each reply is sent with that address
// as its source.
type udpSocket struct {
	fd       int
	port     uint16
	closed   atomic.Bool
	received atomic.Uint64 // datagrams read
}

// listenUDP binds one UDP socket to addr, with SO_REUSEPORT when reuse
// (a member of a udpGroup).
func listenUDP(addr netip.AddrPort, reuse bool) (*udpSocket, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	fail := func(what string, err error) (*udpSocket, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, 1); err != nil {
		return fail("IP_PKTINFO", err)
	}
	// Wake up now and then so Close never depends on shutdown(2) alone.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 250_000}); err != nil {
		return fail("SO_RCVTIMEO", err)
	}
	if reuse {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fail("SO_REUSEPORT", err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}); err != nil {
		return fail("bind", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	return &udpSocket{fd: fd, port: uint16(sa.(*unix.SockaddrInet4).Port)}, nil
}

// shutdown wakes the readers; close releases the socket once they are gone.
func (u *udpSocket) shutdown() {
	u.closed.Store(true)
	unix.Shutdown(u.fd, unix.SHUT_RDWR) // ENOTCONN for UDP, but wakes the readers
}

func (u *udpSocket) close() error { return unix.Close(u.fd) }

// pktinfoSpace is the room of one IP_PKTINFO control message.
// (unix.CmsgSpace(unix.SizeofInet4Pktinfo), as a constant).
const pktinfoSpace = int((unix.SizeofCmsghdr+cmsgAlign-1)&^(cmsgAlign-1) + (unix.SizeofInet4Pktinfo+cmsgAlign-1)&^(cmsgAlign-1))

const cmsgAlign = unsafe.Sizeof(uintptr(0))

// pktinfoDst returns the destination address from the IP_PKTINFO control
// message in oob (ipi_addr, as ipv4.ControlMessage.Parse reads it).
func pktinfoDst(oob []byte) (dst [4]byte, ok bool) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return dst, false
		}
		if h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && l >= unix.CmsgLen(unix.SizeofInet4Pktinfo) {
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&oob[unix.CmsgLen(0)]))
			dst, ok = pi.Addr, true
		}
		l = unix.CmsgSpace(l - unix.CmsgLen(0))
		if l > len(oob) {
			break
		}
		oob = oob[l:]
	}
	return dst, ok
}

// setPktinfoSrc makes b an IP_PKTINFO control message that sends from src
// (ipi_spec_dst, as ipv4.ControlMessage.Marshal writes it).
func setPktinfoSrc(b *[pktinfoSpace]byte, src [4]byte) {
	*b = [pktinfoSpace]byte{}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = unix.IPPROTO_IP
	h.Type = unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
	pi.Spec_dst = src
}

func (u *udpSocket) send(b []byte, src netip.Addr, to unix.Sockaddr) error {
	oob := (&ipv4.ControlMessage{Src: src.AsSlice()}).Marshal()
	_, err := unix.SendmsgN(u.fd, b, oob, to, 0)
	return err
}

// serveOne is one UDP worker reading a datagram per recvmsg(2).
func (u *udpSocket) serveOne(r *Resolver) {
	buf := make([]byte, udpBufSize+1)
	oob := make([]byte, 128)
	for !u.closed.Load() {
		n, oobn, flags, from, err := unix.Recvmsg(u.fd, buf, oob, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if !u.closed.Load() {
				r.log.Warn("udp read", "err", err)
			}
			continue
		}
		u.received.Add(1)
		if from == nil || n > udpBufSize || flags&unix.MSG_TRUNC != 0 {
			continue
		}
		// Without the destination address the session is unknown: drop.
		var cm ipv4.ControlMessage
		if oobn == 0 || flags&unix.MSG_CTRUNC != 0 || cm.Parse(oob[:oobn]) != nil || cm.Dst == nil {
			continue
		}
		dst, ok := netip.AddrFromSlice(cm.Dst)
		if !ok {
			continue
		}
		dst = dst.Unmap()
		idx, _ := SessionIndexFromAddr(dst)
		reply, limited := r.admit(idx, "udp", buf[:n], r.cfg.now(), nil)
		if !limited {
			reply = u.handle(r, dst, from, buf[:n])
			if reply == nil {
				runtime.Gosched() // see serve (udp_mmsg_linux.go)
				continue
			}
		}
		if reply == nil {
			continue
		}
		// Reply from the address the query was sent to.
		if err := u.send(reply, dst, from); err != nil && !u.closed.Load() {
			r.log.Debug("udp write", "err", err)
		}
	}
}

// handle answers one datagram sent to dst: it returns the reply to send now,
// or nil when there is none or when the query went to its own goroutine,
// which then sends the reply itself. A query goes to its own goroutine when
// it must ask the upstream, or when its answer must first write kernel
// entries: this worker answers from the cache only, and never waits for the
// upstream or the dataplane.
func (u *udpSocket) handle(r *Resolver, dst netip.Addr, from unix.Sockaddr, raw []byte) []byte {
	reply, req, p := r.beginRaw(dst, "udp", raw)
	if p == nil {
		return reply
	}
	if p.res == nil {
		u.spawn(r, p, dst, from, func() *dns.Msg { return r.finish(r.ctx, p) })
		return nil
	}
	if m := r.resolve(r.ctx, p); m != nil {
		return r.packReply(req, m, "udp")
	}
	pl := r.plan(p)
	if len(pl.todo) > 0 {
		u.spawn(r, p, dst, from, func() *dns.Msg { return r.complete(p, pl) })
		return nil
	}
	return r.packReply(req, r.complete(p, pl), "udp")
}

// spawn runs f, which answers p, on a goroutine of its own and sends its
// reply: at most MaxInflight at once, and PerSessionLimit per session;
// beyond that the datagram is dropped (and counted) and the client retries.
func (u *udpSocket) spawn(r *Resolver, p *pending, dst netip.Addr, from unix.Sockaddr, f func() *dns.Msg) {
	if !r.upPer.acquire(p.q.index) {
		both(&r.stats.total, p.q.sc, func(c *counters) { c.dropped.Add(1) })
		return
	}
	select {
	case r.sem <- struct{}{}:
	default:
		r.upPer.release(p.q.index)
		both(&r.stats.total, p.q.sc, func(c *counters) { c.dropped.Add(1) })
		return
	}
	r.wg.Go(func() {
		defer func() { <-r.sem; r.upPer.release(p.q.index) }()
		if b := r.packReply(p.q.req, f(), "udp"); b != nil {
			if err := u.send(b, dst, from); err != nil && !u.closed.Load() {
				r.log.Debug("udp write", "err", err)
			}
		}
	})
}
