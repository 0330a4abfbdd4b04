//go:build !linux

package dnsresolver

import "net/netip"

// udpSocket needs IP_PKTINFO and the kernel redirect: Linux only.
type udpSocket struct{ port uint16 }

func listenUDP(netip.AddrPort) (*udpSocket, error) { return nil, ErrNotSupported }
func (*udpSocket) shutdown()                       {}
func (*udpSocket) close() error                    { return nil }
func (*udpSocket) serve(*Resolver)                 {}
