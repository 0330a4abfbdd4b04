package probe

import (
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// denyFlood serves "denyflood THREADS N IP PORT": THREADS threads (each
// locked to its own OS thread, so the scheduler spreads them over the
// CPUs), each with its own unconnected UDP socket, send one datagram to
// each of N distinct destinations IP+k:PORT (k running on over all
// threads), as fast as they can. Answers "ok EPERM OTHER": how many sends
// the kernel refused with EPERM, and how many ended any other way.
func denyFlood(f []string) string {
	if len(f) != 5 {
		return "err want denyflood THREADS N IP PORT"
	}
	threads, err1 := strconv.Atoi(f[1])
	n, err2 := strconv.Atoi(f[2])
	ip, err3 := netip.ParseAddr(f[3])
	port, err4 := strconv.Atoi(f[4])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || !ip.Is4() || threads < 1 || n < 0 {
		return "err want denyflood THREADS N IPv4 PORT"
	}
	var mu sync.Mutex
	var eperm, other int
	var wg sync.WaitGroup
	base := ip.As4()
	start := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	for t := 0; t < threads; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			runtime.LockOSThread()
			var e, o int
			defer func() { mu.Lock(); eperm += e; other += o; mu.Unlock() }()
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				o += n
				return
			}
			defer unix.Close(fd)
			for i := 0; i < n; i++ {
				a := start + uint32(t*n+i)
				sa := &unix.SockaddrInet4{Port: port, Addr: [4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}}
				if err := unix.Sendto(fd, []byte("x"), 0, sa); err == unix.EPERM {
					e++
				} else {
					o++
				}
			}
		}(t)
	}
	wg.Wait()
	return fmt.Sprintf("ok %d %d", eperm, other)
}
