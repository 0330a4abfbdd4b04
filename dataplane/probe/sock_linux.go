package probe

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// localPort is the port fd is bound to.
func localPort(fd int) (string, error) {
	got, err := unix.Getsockname(fd)
	if err != nil {
		return "", err
	}
	switch sa := got.(type) {
	case *unix.SockaddrInet4:
		return strconv.Itoa(sa.Port), nil
	case *unix.SockaddrInet6:
		return strconv.Itoa(sa.Port), nil
	}
	return "", fmt.Errorf("unexpected socket address %T", got)
}

// pollIn waits up to ms for fd to be readable (again after EINTR, for the
// time left); an error "timeout" when it is not.
func pollIn(fd, ms int) error {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
	n, err := unix.Poll(pfd, ms)
	for err == unix.EINTR {
		n, err = unix.Poll(pfd, max(int(time.Until(deadline)/time.Millisecond), 0))
	}
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("timeout")
	}
	return nil
}

// portCmd serves the commands that test which ports a session socket holds
// (sweep mode's inbound check); ok is false for any other command.
//
//	alisten NAME 4|6     listen without a bind (the kernel autobinds); "ok <port>"
//	usock NAME 4|6       an unbound, unconnected UDP socket (sendto autobinds it)
//	ubindr NAME ADDR     a UDP bind with SO_REUSEADDR and SO_REUSEPORT; "ok <port>"
//	port NAME            the port a socket is bound to; "ok <port>"
//	close NAME           close a socket
func (p *prober) portCmd(f []string) (string, bool) {
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	fam := unix.AF_INET
	if arg(2) == "6" {
		fam = unix.AF_INET6
	}
	switch f[0] {
	case "alisten", "usock":
		typ := unix.SOCK_STREAM
		if f[0] == "usock" {
			typ = unix.SOCK_DGRAM
		}
		fd, err := unix.Socket(fam, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return result("", err), true
		}
		if typ == unix.SOCK_STREAM {
			if err := unix.Listen(fd, 16); err != nil {
				unix.Close(fd)
				return result("", err), true
			}
		}
		p.socks[arg(1)] = fd
		if typ == unix.SOCK_DGRAM {
			return "ok", true
		}
		return result(localPort(fd)), true
	case "ubindr":
		fd, sa, err := p.socket(arg(2), false, unix.SOCK_DGRAM, 0)
		if err != nil {
			return result("", err), true
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return result("", err), true
		}
		p.socks[arg(1)] = fd
		return result(localPort(fd)), true
	case "port", "close":
		fd, ok := p.socks[arg(1)]
		if !ok {
			return "err no such socket", true
		}
		if f[0] == "port" {
			return result(localPort(fd)), true
		}
		delete(p.socks, arg(1))
		return result("", unix.Close(fd)), true
	}
	return "", false
}
