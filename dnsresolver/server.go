package dnsresolver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
)

const (
	udpBufSize = 4096 // a query larger than this is malformed
	tcpIdle    = 10 * time.Second
	tcpMaxMsgs = 1000 // per connection
)

// Start binds the UDP and TCP sockets on Config.ListenAddr and serves until
// Close. The UDP socket asks for IP_PKTINFO, so each query's destination
// address (the session address) is known and the reply leaves from it.
func (r *Resolver) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return ErrClosed
	case r.started:
		return ErrStarted
	}
	la := net.UDPAddrFromAddrPort(r.cfg.ListenAddr)
	udp, err := net.ListenUDP("udp4", la)
	if err != nil {
		return fmt.Errorf("dnsresolver: listen udp %v: %w", r.cfg.ListenAddr, err)
	}
	pc := ipv4.NewPacketConn(udp)
	if err := pc.SetControlMessage(ipv4.FlagDst, true); err != nil {
		udp.Close()
		return fmt.Errorf("dnsresolver: IP_PKTINFO: %w", err)
	}
	// TCP on the same port as UDP (relevant when ListenAddr's port is 0).
	port := udp.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	tcp, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(r.cfg.ListenAddr.Addr(), port)))
	if err != nil {
		udp.Close()
		return fmt.Errorf("dnsresolver: listen tcp %v: %w", r.cfg.ListenAddr, err)
	}
	r.udp, r.tcp, r.started = udp, tcp, true
	for range r.cfg.UDPWorkers {
		r.wg.Go(func() { r.serveUDP(pc) })
	}
	r.wg.Go(r.serveTCP)
	r.log.Info("dns resolver listening", "port", port, "upstreams", r.cfg.Upstreams)
	return nil
}

// Port is the bound port (useful when ListenAddr's port was 0), or 0 before Start.
func (r *Resolver) Port() uint16 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.udp == nil {
		return 0
	}
	return r.udp.LocalAddr().(*net.UDPAddr).AddrPort().Port()
}

// Close stops serving, waits for queries in flight, and releases the sockets.
// From then on queries to the port fail (no listener): entries already in the
// kernel live until they expire.
func (r *Resolver) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.cancel()
	var errs []error
	if r.udp != nil {
		errs = append(errs, r.udp.Close())
	}
	if r.tcp != nil {
		errs = append(errs, r.tcp.Close())
	}
	r.mu.Unlock()
	r.wg.Wait()
	return errors.Join(errs...)
}

// serveUDP is one of MaxInflight/… long-lived workers: each reads a packet
// and answers it inline, so a slow upstream blocks only its own worker and no
// goroutine is started per packet.
func (r *Resolver) serveUDP(pc *ipv4.PacketConn) {
	buf := make([]byte, udpBufSize+1)
	for {
		n, cm, src, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("udp read", "err", err)
			continue
		}
		// Without the destination address the session is unknown: drop.
		if cm == nil || cm.Dst == nil || n > udpBufSize {
			continue
		}
		dst, ok := netip.AddrFromSlice(cm.Dst)
		if !ok {
			continue
		}
		out := r.handleRaw(dst.Unmap(), "udp", buf[:n])
		if out == nil {
			continue
		}
		// Reply from the address the query was sent to.
		if _, err := pc.WriteTo(out, &ipv4.ControlMessage{Src: cm.Dst}, src); err != nil && !errors.Is(err, net.ErrClosed) {
			r.log.Debug("udp write", "err", err)
		}
	}
}

func (r *Resolver) serveTCP() {
	for {
		c, err := r.tcp.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("tcp accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.wg.Go(func() { r.serveConn(c) })
	}
}

func (r *Resolver) serveConn(c *net.TCPConn) {
	defer c.Close()
	stop := context.AfterFunc(r.ctx, func() { c.Close() })
	defer stop()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	var hdr [2]byte
	for range tcpMaxMsgs {
		c.SetReadDeadline(time.Now().Add(tcpIdle))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(hdr[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		r.sem <- struct{}{}
		out := r.handleRaw(local, "tcp", msg)
		<-r.sem
		if out == nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(tcpIdle))
		buf := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(buf, uint16(len(out)))
		copy(buf[2:], out)
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

// handleRaw answers one wire-format query; nil means send nothing.
func (r *Resolver) handleRaw(local netip.Addr, transport string, raw []byte) []byte {
	req := new(dns.Msg)
	if err := req.Unpack(raw); err != nil {
		// Answer FORMERR when at least the header is there and is a query.
		if len(raw) < 12 || raw[2]&0x80 != 0 {
			return nil
		}
		hdr := new(dns.Msg)
		hdr.Id = binary.BigEndian.Uint16(raw)
		q := r.newQuery(local, transport, hdr)
		why := ReasonMalformed
		if q.session == "" {
			why = ReasonUnknownSession
		}
		m := r.refuse(q, why, dns.RcodeFormatError)
		out, _ := m.Pack()
		return out
	}
	m := r.handle(r.ctx, local, transport, req)
	if m == nil {
		return nil
	}
	if transport == "udp" {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), 1232)
		}
		m.Truncate(size)
	}
	out, err := m.Pack()
	if err != nil {
		r.log.Warn("pack reply", "err", err)
		return nil
	}
	return out
}
