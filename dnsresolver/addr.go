package dnsresolver

import "net/netip"

// The session address space: 127.128.0.0/9. Session index i (1 <= i < 2^23)
// is served at 127.128.0.0 + i. The kernel redirect (bpf/) computes the same
// address; change both together.
const (
	sessionBase     uint32 = 0x7F800000 // 127.128.0.0
	sessionMask     uint32 = 0xFF800000 // /9
	MaxSessionIndex uint32 = 1<<23 - 1
)

// SessionPrefix is the loopback range the session addresses are taken from.
var SessionPrefix = netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 128, 0, 0}), 9)

// SessionAddr is the loopback address at which the session with kernel index
// index is served. It returns the zero Addr for index 0 or index > MaxSessionIndex.
func SessionAddr(index uint32) netip.Addr {
	if index == 0 || index > MaxSessionIndex {
		return netip.Addr{}
	}
	u := sessionBase + index
	return netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)})
}

// SessionIndexFromAddr is the inverse of SessionAddr. It accepts the
// IPv4-mapped IPv6 form too (a dual-stack socket reports that) and reports
// false for every address that is no session's.
func SessionIndexFromAddr(a netip.Addr) (uint32, bool) {
	a = a.Unmap()
	if !a.Is4() {
		return 0, false
	}
	b := a.As4()
	u := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	if u&sessionMask != sessionBase {
		return 0, false
	}
	i := u &^ sessionMask
	if i == 0 {
		return 0, false
	}
	return i, true
}
