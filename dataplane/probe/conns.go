//go:build linux

package probe

import (
	"errors"
	"strings"

	"golang.org/x/sys/unix"
)

// conns connects one socket per destination, in turn, and closes it: each
// argument is "t:ADDR" (a non-blocking TCP connect, so no answer is waited
// for) or "u:ADDR" (a UDP connect, nothing sent), from an AF_INET socket
// for an IPv4 ADDR and an AF_INET6 one for an IPv6 ADDR (a v4-mapped one
// included). It answers "ok R1 R2 ...", each R "ok" or the errno name of the
// connect (EINPROGRESS for a TCP connect on its way): many checks for one
// round trip (the differential tests make thousands).
func conns(args []string) string {
	out := make([]string, 0, len(args)+1)
	out = append(out, "ok")
	for _, a := range args {
		kind, addr, ok := strings.Cut(a, ":")
		if !ok || kind != "t" && kind != "u" {
			return "err bad conns argument " + a
		}
		sa, fam, err := sockaddr(addr, strings.HasPrefix(addr, "["))
		if err != nil {
			return "err " + err.Error()
		}
		typ := unix.SOCK_DGRAM
		if kind == "t" {
			typ = unix.SOCK_STREAM | unix.SOCK_NONBLOCK
		}
		fd, err := unix.Socket(fam, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return result("", err)
		}
		err = unix.Connect(fd, sa)
		unix.Close(fd)
		var en unix.Errno
		switch {
		case err == nil:
			out = append(out, "ok")
		case errors.As(err, &en):
			out = append(out, unix.ErrnoName(en))
		default:
			return "err " + err.Error()
		}
	}
	return strings.Join(out, " ")
}
