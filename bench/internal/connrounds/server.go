//go:build linux

package connrounds

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"golang.org/x/sys/unix"
)

// Server is the accept-and-close server of the connect rounds: one OS
// thread blocked in accept(2) on a blocking socket (not the Go netpoller,
// whose wake-ups land on whichever thread polls), pinned to one CPU when
// cpu >= 0, closing what it accepts.
type Server struct {
	Addr netip.AddrPort // the address it listens on, with its port
	fd   int
	done chan struct{}
}

// ServerCPU is the CPU the accept server runs on: 1 with pin on a machine
// of 2+ CPUs (the worker then runs on CPU 0), else -1 (unpinned). Unpinned,
// the worker was off its CPU for 10-15 % of each round, by an amount that
// varied from round to round (bench/README.md).
func ServerCPU(pin bool) int {
	if pin && benchkit.NumCPU() > 1 {
		return 1
	}
	return -1
}

// AcceptAndClose listens on addr (port 0: any) and accepts on its own
// thread, pinned to cpu when cpu >= 0.
func AcceptAndClose(addr netip.AddrPort, cpu int) (*Server, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) {
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
	srv := &Server{fd: fd, Addr: netip.AddrPortFrom(addr.Addr(), uint16(sa.(*unix.SockaddrInet4).Port)), done: make(chan struct{})}
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
func (s *Server) Close() {
	unix.Shutdown(s.fd, unix.SHUT_RDWR) // wakes the blocked accept
	<-s.done
	unix.Close(s.fd)
}
