//go:build !linux

package dnsresolver

import "net/netip"

// udpGroup needs IP_PKTINFO, SO_REUSEPORT and the kernel redirect: Linux only.
type udpGroup struct{ port uint16 }

func listenUDPGroup(netip.AddrPort, int) (*udpGroup, error) { return nil, ErrNotSupported }
func (*udpGroup) shutdown()                                 {}
func (*udpGroup) close() error                              { return nil }
func (*udpGroup) serve(*Resolver, int) int                  { return 0 }
func (*udpGroup) steer([]uint32) error                      { return ErrNotSupported }
func (*udpGroup) attachSteering(int) error                  { return ErrNotSupported }
func (*udpGroup) kernelDrops() map[uint32]uint64            { return nil }
