package probe

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Descriptor passing (SCM_RIGHTS) between a probe and another probe or the
// test itself, over a datagram socket in the abstract AF_UNIX namespace
// (per network namespace: session probes share the test's), and accepting
// many connections, for the socket count's hostile paths (bpf/quota.bpf.h).
//
//	fdsend NAME ADDR         send every socket of group NAME to @ADDR in one message; "ok <n>"
//	fdrecv NAME ADDR MS      receive one message of sockets on @ADDR within MS, add them to group NAME; "ok <n>"
//	naccept NAME LNAME N MS  accept N connections on listener LNAME, each within MS, into group NAME; "ok <n>"
//	mlisten NAME ADDR        listen on MPTCP ADDR (IPv4, port 0: any), keep it as NAME; "ok <port>"
func (p *prober) fdCmd(f []string) (string, bool) {
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	name := arg(1)
	switch f[0] {
	case "fdsend":
		g := p.groups[name]
		if err := SendFDs(arg(2), g); err != nil {
			return result("", err), true
		}
		return result(strconv.Itoa(len(g)), nil), true
	case "fdrecv":
		ms, _ := strconv.Atoi(arg(3))
		fds, err := RecvFDs(arg(2), ms)
		if err != nil {
			return result("", err), true
		}
		p.groups[name] = append(p.groups[name], fds...)
		return result(strconv.Itoa(len(fds)), nil), true
	case "mlisten":
		fd, sa, err := p.socket(arg(2), false, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)
		if err != nil {
			return result("", err), true
		}
		if err := unix.Bind(fd, sa); err == nil {
			err = unix.Listen(fd, 64)
		}
		if err != nil {
			unix.Close(fd)
			return result("", err), true
		}
		p.socks[name] = fd
		return result(localPort(fd)), true
	case "naccept":
		lfd, ok := p.socks[arg(2)]
		if !ok {
			return "err no such socket", true
		}
		n, _ := strconv.Atoi(arg(3))
		ms, _ := strconv.Atoi(arg(4))
		for i := 0; i < n; i++ {
			if err := pollIn(lfd, ms); err != nil {
				return fmt.Sprintf("ok %d err %v", i, err), true
			}
			fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
			if err != nil {
				return fmt.Sprintf("ok %d err %v", i, err), true
			}
			p.groups[name] = append(p.groups[name], fd)
		}
		return result(strconv.Itoa(n), nil), true
	}
	return "", false
}

// SendFDs sends fds in one SCM_RIGHTS message to the abstract datagram
// socket @addr, waiting up to 2 s for a receiver to bind it.
func SendFDs(addr string, fds []int) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrUnix{Name: "@" + addr}
	deadline := time.Now().Add(2 * time.Second)
	for {
		err = unix.Connect(fd, sa)
		if err == nil || !errors.Is(err, unix.ECONNREFUSED) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	return unix.Sendmsg(fd, []byte{'f'}, unix.UnixRights(fds...), nil, 0)
}

// RecvFDs binds the abstract datagram socket @addr and returns the
// descriptors of the first message that arrives within ms.
func RecvFDs(addr string, ms int) ([]int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + addr}); err != nil {
		return nil, err
	}
	if err := pollIn(fd, ms); err != nil {
		return nil, err
	}
	oob := make([]byte, unix.CmsgSpace(4*250))
	_, oobn, _, _, err := unix.Recvmsg(fd, make([]byte, 1), oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, err
		}
		fds = append(fds, r...)
	}
	return fds, nil
}
