package memory

import (
	"fmt"
	"net/netip"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The use-time checks: what the Linux backend's BPF programs decide at a
// connect, an unconnected send or a new inbound flow (bpf/sock_addr.bpf.c,
// bpf/egress_map.bpf.h, bpf/handle.bpf.h, bpf/skb.bpf.c), evaluated on the
// model's tables. Tests call them where a kernel test would make a real
// connect. Not modelled: the per-session resolver addresses (127.128.0.0/9)
// and open flows (a revoke has no socket to cut).

// use is what a handle check is for (enum shk_use).
type use int

const (
	useFlow    use = iota // a flow already allowed: live, once and used pass
	useNew                // a new flow, not consuming: live and once pass
	useConsume            // a new flow that consumes an approve-once handle
)

// Which rules a lookup tries (SHK_DIR_OUT, SHK_DIR_IN).
const (
	dirOut = 1
	dirIn  = 2
)

// Connect is the kernel's decision for a connect (or an unconnected send)
// from session to dst over proto: backend.ReasonNone when it is allowed,
// else why not. A denial is counted (Counters) and reported (Events) as the
// kernel does; an allowed use consumes the approve-once handle that allowed
// it. An unknown session is denied (ReasonUnknownSession, counted at index
// 0), as a cgroup under the sessions' parent that is no session is. The
// error is only for a malformed destination.
func (b *Backend) Connect(name string, dst netip.AddrPort, proto backend.Proto) (backend.Reason, error) {
	if !dst.IsValid() {
		return backend.ReasonNoRule, fmt.Errorf("%w: destination %v", backend.ErrInvalidPrefix, dst)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	addr := dst.Addr().WithZone("").Unmap()
	s, ok := b.sessions[name]
	if !ok {
		b.deny(nil, backend.ReasonUnknownSession, proto, netip.AddrPortFrom(addr, dst.Port()))
		return backend.ReasonUnknownSession, nil
	}
	// An unspecified destination is loopback (the kernel's rewrite).
	if addr == netip.IPv4Unspecified() {
		addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	} else if addr == netip.IPv6Unspecified() {
		addr = netip.IPv6Loopback()
	}
	port := dst.Port()
	if (proto == backend.ProtoTCP || proto == backend.ProtoUDP) && port == 53 && b.dnsPort != 0 {
		return backend.ReasonNone, nil // re-aimed at the agent's resolver
	}
	var why backend.Reason
	if backend.Denied(b.denyTable, addr, port) {
		why = backend.ReasonForbidden
	} else if b.neverListed(addr, port) {
		why = b.neverException(s.Index, addr, port)
	} else {
		why = b.lookup(s, addr, proto, port, 0, dirOut, true, useConsume)
	}
	if why != backend.ReasonNone {
		b.deny(s, why, proto, netip.AddrPortFrom(addr, port))
	}
	return why, nil
}

// Accept is the kernel's decision for a new inbound flow to session from
// peer, to the session's own localPort over proto (a TCP SYN to a
// listener, a datagram to an unconnected UDP socket): allowed only by an
// inbound rule (source prefix, local port) under a live handle, or, for a
// datagram, when it comes from where the session may send (a reply).
// A refusal reads (and is counted as) ReasonNoInbound; an approve-once
// inbound grant admits one flow.
func (b *Backend) Accept(name string, peer netip.AddrPort, localPort uint16, proto backend.Proto) (backend.Reason, error) {
	if !peer.IsValid() {
		return backend.ReasonNoInbound, fmt.Errorf("%w: peer %v", backend.ErrInvalidPrefix, peer)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	addr := peer.Addr().WithZone("").Unmap()
	s, ok := b.sessions[name]
	if !ok {
		b.deny(nil, backend.ReasonUnknownSession, proto, netip.AddrPortFrom(addr, localPort))
		return backend.ReasonUnknownSession, nil
	}
	if proto == backend.ProtoUDP && b.lookup(s, addr, proto, peer.Port(), 0, dirOut, false, useFlow) == backend.ReasonNone &&
		!backend.Denied(b.denyTable, addr, peer.Port()) {
		return backend.ReasonNone, nil
	}
	if b.lookup(s, addr, proto, 0, localPort, dirIn, false, useConsume) == backend.ReasonNone {
		return backend.ReasonNone, nil
	}
	b.deny(s, backend.ReasonNoInbound, proto, netip.AddrPortFrom(addr, localPort))
	return backend.ReasonNoInbound, nil
}

// neverListed reports whether a never-list entry for port, or for every
// port, covers addr; b.mu held.
func (b *Backend) neverListed(addr netip.Addr, port uint16) bool {
	for _, n := range b.never {
		if (n.Port == port || n.Port == 0) && n.Prefix.Contains(addr) {
			return true
		}
	}
	return false
}

// neverException checks the session's exception for (addr, port), then
// for (addr, every port), under the one handle it points at; b.mu held.
func (b *Backend) neverException(session uint32, addr netip.Addr, port uint16) backend.Reason {
	n := b.neverOKs[neverKey{session: session, addr: addr, port: port}]
	if n == nil {
		n = b.neverOKs[neverKey{session: session, addr: addr}]
	}
	if n == nil {
		return backend.ReasonNoRule
	}
	return b.handleCheck(n.cur, useConsume)
}

// lookup tries the exact-address entry, then the covering prefixes from the
// longest to the shortest (at most MaxCover), and returns ReasonNone at the
// first rule that allows, else the most telling reason seen; b.mu held.
func (b *Backend) lookup(s *session, addr netip.Addr, proto backend.Proto, dport, lport uint16, dirs int, ruleExpiry bool, u use) backend.Reason {
	best := backend.ReasonNoRule
	if e, ok := s.entries[netip.PrefixFrom(addr, addr.BitLen())]; ok {
		if best = b.tryRules(e, proto, dport, lport, dirs, ruleExpiry, u, best); best == backend.ReasonNone {
			return best
		}
	}
	visited := 0
	for bits := addr.BitLen() - 1; bits >= 0 && visited < MaxCover; bits-- {
		p, _ := addr.Prefix(bits)
		e, ok := s.entries[p]
		if !ok {
			continue
		}
		visited++
		if best = b.tryRules(e, proto, dport, lport, dirs, ruleExpiry, u, best); best == backend.ReasonNone {
			return best
		}
	}
	return best
}

// tryRules tries one entry's rules in order; b.mu held.
func (b *Backend) tryRules(e *entry, proto backend.Proto, dport, lport uint16, dirs int, ruleExpiry bool, u use, best backend.Reason) backend.Reason {
	for _, r := range e.rules {
		port := dport
		if r.Inbound {
			if dirs&dirIn == 0 {
				continue
			}
			port = lport
		} else if dirs&dirOut == 0 {
			continue
		}
		if r.Proto != backend.ProtoAny && r.Proto != proto {
			continue
		}
		if !r.Ports.IsAny() && (port < r.Ports.Lo || port > r.Ports.Hi) {
			continue
		}
		if ruleExpiry && b.expired(r.Expires) {
			if best == backend.ReasonNoRule {
				best = backend.ReasonRuleExpired
			}
			continue
		}
		why := b.handleCheck(r.Handle, u)
		if why == backend.ReasonNone {
			return why
		}
		best = why
	}
	return best
}

// handleCheck is shk_handle_check: ref and every ancestor must be alive for
// the use and unexpired; the allowing handle itself, when approve-once and
// the use consumes, moves to used (the compare-and-swap: b.mu makes it
// atomic, so of two racing uses exactly one passes). An ancestor found dead
// after that still refuses the use, and the once handle stays spent, as in
// the kernel; b.mu held.
func (b *Backend) handleCheck(ref backend.HandleRef, u use) backend.Reason {
	n, gen := ref.Slot, ref.Generation
	for i := 0; i < MaxChain; i++ {
		if n == 0 || n >= b.cfg.MaxHandles {
			return backend.ReasonHandleRevoked
		}
		var h slot
		if int(n) < len(b.handles) {
			h = b.handles[n]
		}
		if h.gen != gen {
			return backend.ReasonHandleRevoked
		}
		switch h.state {
		case backend.HandleLive, backend.HandleOnce:
		case backend.HandleUsed:
			if u != useFlow {
				return backend.ReasonHandleRevoked // its one use is spent
			}
		default:
			return backend.ReasonHandleRevoked
		}
		if b.expired(h.expires) {
			return backend.ReasonHandleExpired
		}
		if i == 0 && h.state == backend.HandleOnce && u == useConsume {
			b.handles[n].state = backend.HandleUsed
		}
		if h.parent.IsZero() {
			return backend.ReasonNone
		}
		n, gen = h.parent.Slot, h.parent.Generation
	}
	return backend.ReasonHandleRevoked // deeper than ever issued: fail closed
}
