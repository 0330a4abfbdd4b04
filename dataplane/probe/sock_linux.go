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
