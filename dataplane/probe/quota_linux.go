package probe

import (
	"fmt"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"
)

// quotaCmd serves the commands that test a session's socket and port limits
// (bpf/quota.bpf.h); ok is false for any other command. Each opens sockets
// one after another until N are open or one call fails, and answers
// "ok <opened>" or "ok <opened> err <the failure>"; the sockets stay open
// under NAME.
//
//	nsock NAME N tcp|udp|unix|pair  N sockets (pair: socketpair, two each)
//	nbind NAME N IP                 N UDP sockets, each bound to IP, port 0
//	nconn NAME N IP PORT            N UDP sockets connected to IP+i:PORT
//	closen NAME K                   close K of NAME's sockets
//	dupclose NAME                   dup each of NAME's sockets and close the dups
//
// and denyflood (flood_linux.go), a flood of refused sends, and fdsend,
// fdrecv and naccept (fdpass_linux.go).
func (p *prober) quotaCmd(f []string) (string, bool) {
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	if arg(0) == "denyflood" {
		return denyFlood(f), true
	}
	if r, ok := p.fdCmd(f); ok {
		return r, true
	}
	n, _ := strconv.Atoi(arg(2))
	name := arg(1)
	keep := func(fd int) { p.groups[name] = append(p.groups[name], fd) }
	report := func(opened int, err error) string {
		if err != nil {
			return fmt.Sprintf("ok %d err %v", opened, err)
		}
		return fmt.Sprintf("ok %d", opened)
	}
	switch f[0] {
	case "nsock":
		for i := 0; i < n; i++ {
			var fd int
			var err error
			switch arg(3) {
			case "tcp":
				fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			case "udp":
				fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			case "unix":
				fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			case "pair":
				var fds [2]int
				fds, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err == nil {
					keep(fds[1])
					fd = fds[0]
				}
			default:
				return "err unknown socket kind " + arg(3), true
			}
			if err != nil {
				return report(i, err), true
			}
			keep(fd)
		}
		return report(n, nil), true
	case "nbind", "nconn":
		ip, err := netip.ParseAddr(arg(3))
		if err != nil || !ip.Is4() {
			return "err want an IPv4 address", true
		}
		port, _ := strconv.Atoi(arg(4))
		for i := 0; i < n; i++ {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return report(i, err), true
			}
			if f[0] == "nbind" {
				err = unix.Bind(fd, &unix.SockaddrInet4{Addr: ip.As4()})
			} else {
				err = unix.Connect(fd, &unix.SockaddrInet4{Addr: ip.As4(), Port: port})
				ip = ip.Next()
			}
			if err != nil {
				unix.Close(fd)
				return report(i, err), true
			}
			keep(fd)
		}
		return report(n, nil), true
	case "closen":
		g := p.groups[name]
		n = min(n, len(g))
		for _, fd := range g[len(g)-n:] {
			unix.Close(fd)
		}
		p.groups[name] = g[:len(g)-n]
		return report(n, nil), true
	case "dupclose":
		for i, fd := range p.groups[name] {
			d, err := unix.Dup(fd)
			if err != nil {
				return report(i, err), true
			}
			unix.Close(d)
		}
		return report(len(p.groups[name]), nil), true
	}
	return "", false
}
