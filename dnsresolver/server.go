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
)

const (
	udpBufSize = 4096 // a query larger than this is malformed
	tcpIdle    = 10 * time.Second
	tcpMaxMsgs = 1000 // per connection
)

// Start binds the UDP sockets (Config.UDPSockets of them and the penalty
// socket, one SO_REUSEPORT group: reuseport_linux.go) and the TCP socket on
// Config.ListenAddr and serves until Close. The UDP sockets ask for
// IP_PKTINFO, so each query's destination address (the session address) is
// known and the reply leaves from it.
func (r *Resolver) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return ErrClosed
	case r.started:
		return ErrStarted
	}
	started := false
	if r.watch {
		ctx, stop := context.WithCancel(r.ctx)
		defer func() {
			if !started {
				stop()
			}
		}()
		if err := WatchHostAddrs(ctx, r.host); err != nil {
			return err
		}
	}
	var (
		udp *udpGroup
		tcp *net.TCPListener
		err error
	)
	// With port 0, UDP picks a port and TCP must get the same one; retry
	// when that TCP port is taken.
	for try := 0; ; try++ {
		udp, err = listenUDPGroup(r.cfg.ListenAddr, r.cfg.UDPSockets)
		if err != nil {
			return fmt.Errorf("dnsresolver: listen udp %v: %w", r.cfg.ListenAddr, err)
		}
		tcp, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(r.cfg.ListenAddr.Addr(), udp.port)))
		if err == nil {
			break
		}
		udp.close()
		if r.cfg.ListenAddr.Port() != 0 || try == 20 {
			return fmt.Errorf("dnsresolver: listen tcp %v: %w", r.cfg.ListenAddr, err)
		}
	}
	r.udp, r.tcp, r.started, started = udp, tcp, true, true
	// Steer each session's datagrams to one socket, and the penalty box's
	// to the penalty socket up to their rate (steer_linux.go).
	if err := udp.attachSteering(r.cfg.QueryRate); err != nil {
		r.log.Warn("dns socket steering not attached: datagrams spread by the kernel's hash, a flooder's read by the agent", "err", err)
	} else {
		steer := func(idx []uint32) {
			if err := udp.steer(idx); err != nil {
				r.log.Warn("dns socket steering: penalty box not updated", "err", err)
			}
		}
		r.box.mu.Lock()
		r.box.steer = steer
		steer(r.Penalised())
		r.box.mu.Unlock()
	}
	r.parked = udp.serve(r, r.cfg.UDPWorkers)
	r.wg.Go(r.serveTCP)
	r.wg.Go(r.maintain)
	r.log.Info("dns resolver listening", "port", udp.port, "upstreams", r.cfg.Upstreams)
	return nil
}

// Port is the bound port (useful when ListenAddr's port was 0), or 0 before Start.
func (r *Resolver) Port() uint16 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.udp == nil {
		return 0
	}
	return r.udp.port
}

// ParkedWorkers is how many goroutines the resolver keeps parked in blocking
// system calls, waiting for queries: its UDP workers, each on a thread of
// its own in recvmmsg(2) (0 before Start). The Go scheduler counts each
// against GOMAXPROCS from its wake-up until the runtime's monitor takes
// its processor back, up to 10 ms after it went back to sleep: a daemon
// adds this many to GOMAXPROCS so that its other goroutines (a query's
// upstream exchange, an API request) never wait for that while the
// workers sleep (cmd/shinken-agent/gomaxprocs.go).
func (r *Resolver) ParkedWorkers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parked
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
		r.udp.shutdown()
	}
	if r.tcp != nil {
		errs = append(errs, r.tcp.Close())
	}
	r.mu.Unlock()
	r.udpWG.Wait()
	r.wg.Wait()
	if r.udp != nil {
		// Only now: no goroutine can still use the descriptor.
		errs = append(errs, r.udp.close())
	}
	r.fwd.close()
	return errors.Join(errs...)
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
		idx, _ := SessionIndexFromAddr(c.LocalAddr().(*net.TCPAddr).AddrPort().Addr())
		if !r.tcpPer.acquire(idx) {
			c.Close() // at Config.PerSessionLimit for this session
			continue
		}
		select {
		case r.tcpConns <- struct{}{}:
		default:
			r.tcpPer.release(idx)
			c.Close() // at Config.MaxTCPConns: refuse, the client retries
			continue
		}
		r.wg.Go(func() {
			defer func() { <-r.tcpConns; r.tcpPer.release(idx) }()
			r.serveConn(c)
		})
	}
}

func (r *Resolver) serveConn(c *net.TCPConn) {
	defer c.Close()
	stop := context.AfterFunc(r.ctx, func() { c.Close() })
	defer stop()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	idx, _ := SessionIndexFromAddr(local)
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
		out, limited := r.admit(idx, "tcp", msg, r.cfg.now(), nil)
		if !limited {
			r.sem <- struct{}{}
			out = r.handleRaw(local, "tcp", msg)
			<-r.sem
		}
		if out == nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(tcpIdle))
		buf := make([]byte, 2+len(out)) // len(out) <= 65535: packReply
		binary.BigEndian.PutUint16(buf, uint16(len(out)))
		copy(buf[2:], out)
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

// handleRaw answers one wire-format query; nil means send nothing.
func (r *Resolver) handleRaw(local netip.Addr, transport string, raw []byte) []byte {
	out, req, p := r.beginRaw(local, transport, raw)
	if p != nil {
		return r.packReply(req, r.finish(r.ctx, p), transport)
	}
	return out
}

// beginRaw unpacks a query and runs begin: it returns the packed reply, or
// the unpacked request and a pending query to finish.
func (r *Resolver) beginRaw(local netip.Addr, transport string, raw []byte) ([]byte, *dns.Msg, *pending) {
	req := new(dns.Msg)
	if err := req.Unpack(raw); err != nil {
		// Answer FORMERR when at least the header is there and is a query.
		if len(raw) < 12 || raw[2]&0x80 != 0 {
			return nil, nil, nil
		}
		hdr := new(dns.Msg)
		hdr.Id = binary.BigEndian.Uint16(raw)
		q := r.newQuery(local, transport, hdr)
		why := ReasonMalformed
		if q.session == "" {
			why = ReasonUnknownSession
		}
		out, _ := r.refuse(q, why, dns.RcodeFormatError).Pack()
		if q.session == "" && transport == "udp" && !local.IsLoopback() {
			return nil, nil, nil // see begin: no reflection
		}
		return out, nil, nil
	}
	m, p := r.begin(local, transport, req)
	if p != nil {
		return nil, req, p
	}
	return r.packReply(req, m, transport), nil, nil
}

// packReply packs m, truncated to what the client can take: over UDP its
// advertised size (512 without EDNS, at most 1232), over TCP the 65,535
// bytes a frame's 16-bit length can say. Truncating drops whole records and
// sets TC.
func (r *Resolver) packReply(req, m *dns.Msg, transport string) []byte {
	if m == nil {
		return nil
	}
	size := dns.MaxMsgSize
	if transport == "udp" {
		size = dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), 1232)
		}
	}
	m.Truncate(size)
	out, err := m.Pack()
	if err == nil && len(out) > size {
		err = fmt.Errorf("%d bytes after truncation to %d", len(out), size)
	}
	if err != nil {
		r.log.Warn("pack reply", "err", err)
		return nil
	}
	return out
}
