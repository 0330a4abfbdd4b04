package probe

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

func sendmmsg(fd int, sa unix.Sockaddr) error {
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return unix.EAFNOSUPPORT
	}
	var rsa unix.RawSockaddrInet4
	rsa.Family = unix.AF_INET
	rsa.Port = uint16(in4.Port>>8) | uint16(in4.Port&0xff)<<8
	rsa.Addr = in4.Addr
	payload := []byte("xy")
	iov := unix.Iovec{Base: &payload[0]}
	iov.SetLen(len(payload))
	var msgs [2]unix.Mmsghdr
	for i := range msgs {
		msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&rsa))
		msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		msgs[i].Hdr.Iov = &iov
		msgs[i].Hdr.SetIovlen(1)
	}
	_, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), 2, 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func rawICMP(addr string) error {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// ICMP echo request, id 1 seq 1, checksum precomputed for this payload.
	pkt := []byte{8, 0, 0, 0, 0, 1, 0, 1}
	var sum uint32
	for i := 0; i < len(pkt); i += 2 {
		sum += uint32(pkt[i])<<8 | uint32(pkt[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	cs := ^uint16(sum)
	pkt[2], pkt[3] = byte(cs>>8), byte(cs)
	return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: a.As4()})
}

func bpfObjGet(path string) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	attr := struct {
		pathname  uint64
		bpfFd     uint32
		fileFlags uint32
	}{pathname: uint64(uintptr(unsafe.Pointer(p)))}
	fd, _, e := unix.Syscall(unix.SYS_BPF, 7 /* BPF_OBJ_GET */, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if e != 0 {
		return e
	}
	unix.Close(int(fd))
	return nil
}
