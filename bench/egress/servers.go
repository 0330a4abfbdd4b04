//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"

	"golang.org/x/sys/unix"
)

// Servers: the accept-and-close and discard ends of the rounds.

// server is the accept-and-close server of the connect rounds: one OS thread
// blocked in accept(2) on a blocking socket (not the Go netpoller, whose
// wake-ups land on whichever thread polls), pinned to one CPU when cpu >= 0,
// closing what it accepts.
type server struct {
	fd   int
	addr netip.AddrPort
	done chan struct{}
}

func acceptAndClose(addr netip.AddrPort, cpu int) (*server, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*server, error) {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}); err != nil {
		return fail(err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		return fail(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fail(err)
	}
	srv := &server{fd: fd, addr: netip.AddrPortFrom(addr.Addr(), uint16(sa.(*unix.SockaddrInet4).Port)), done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(srv.done)
		// The thread exits with the goroutine: it is never unlocked.
		runtime.LockOSThread()
		if cpu >= 0 {
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				started <- fmt.Errorf("pin the server to CPU %d: %w", cpu, err)
				return
			}
		}
		started <- nil
		for {
			nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
			switch {
			case err == nil:
				unix.Close(nfd)
			case errors.Is(err, unix.EINTR), errors.Is(err, unix.ECONNABORTED):
			default:
				return // shut down
			}
		}
	}()
	if err := <-started; err != nil {
		<-srv.done
		return fail(err)
	}
	return srv, nil
}

// Close stops the accept thread and closes the socket.
func (s *server) Close() {
	unix.Shutdown(s.fd, unix.SHUT_RDWR) // wakes the blocked accept
	<-s.done
	unix.Close(s.fd)
}

func discard(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return ln, nil
}
