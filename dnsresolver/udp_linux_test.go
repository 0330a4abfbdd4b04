package dnsresolver

import (
	"bytes"
	"net"
	"testing"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// TestPktinfo: the hand-rolled IP_PKTINFO reader and writer agree with
// golang.org/x/net/ipv4.
func TestPktinfo(t *testing.T) {
	if pktinfoSpace != unix.CmsgSpace(unix.SizeofInet4Pktinfo) {
		t.Fatalf("pktinfoSpace %d, want %d", pktinfoSpace, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
	}
	src := [4]byte{127, 128, 1, 2}
	var b [pktinfoSpace]byte
	b[5] = 0xff // overwritten
	setPktinfoSrc(&b, src)
	if want := (&ipv4.ControlMessage{Src: net.IP(src[:])}).Marshal(); !bytes.Equal(b[:], want) {
		t.Fatalf("marshal\n%x, want\n%x", b, want)
	}
	// A received message: another control message first, then IP_PKTINFO.
	other := unix.UnixRights(3)
	pi := make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&pi[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	copy(pi[unix.CmsgLen(0)+8:], []byte{127, 128, 0, 9}) // ipi_addr
	copy(pi[unix.CmsgLen(0)+4:], []byte{10, 0, 0, 1})    // ipi_spec_dst
	for _, oob := range [][]byte{pi, append(other, pi...)} {
		var cm ipv4.ControlMessage
		if err := cm.Parse(oob); err != nil {
			t.Fatal(err)
		}
		got, ok := pktinfoDst(oob)
		if !ok || !bytes.Equal(got[:], cm.Dst.To4()) {
			t.Fatalf("pktinfoDst %v %v, ipv4 says %v", got, ok, cm.Dst)
		}
	}
	for _, oob := range [][]byte{nil, other, pi[:unix.CmsgLen(0)+4], {1, 2, 3}} {
		if got, ok := pktinfoDst(oob); ok {
			t.Fatalf("pktinfoDst(%x) = %v", oob, got)
		}
	}
}
