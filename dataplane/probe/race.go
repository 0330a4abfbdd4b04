//go:build linux

package probe

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RaceFD is the descriptor a racer process inherits its shared words on
// (exec.Cmd.ExtraFiles[0]): a file of at least RaceBytes, MAP_SHARED.
const (
	RaceFD    = 3
	RaceBytes = 4096
)

// Barrier is the start barrier of racing connects: Ready counts the
// racers with their socket made, N is how many there are (set by whoever
// starts a round), Go is the round released. The racer that completes the
// count releases the round, so no thread outside the race (the test's)
// stands between the racers and the start; each spins on Go, so a racer
// running on its own CPU starts within a cache-line transfer of the others.
type Barrier struct {
	Ready, N, Go atomic.Uint32
}

// MapBarrier views the start of a RaceBytes mapping as the barrier words.
func MapBarrier(mem []byte) *Barrier {
	if len(mem) < int(unsafe.Sizeof(Barrier{})) {
		panic("probe: race mapping too small")
	}
	return (*Barrier)(unsafe.Pointer(&mem[0]))
}

// arriveAndWait adds this racer to w.Ready, releases round if it is the
// last to arrive, and spins until round is released (at most 10 s).
func (w *Barrier) arriveAndWait(round uint32) error {
	if w.Ready.Add(1) == w.N.Load() {
		w.Go.Store(round)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; w.Go.Load() != round; i++ {
		if i%(1<<16) == 0 && time.Now().After(deadline) {
			return errors.New("race: round never released")
		}
	}
	return nil
}

// racer is one racing process: it connects a TCP socket to addr the moment
// round is released on the words shared through fd 3 and answers "ok" or
// "err ERRNO" (see TestOnceMeansOnce).
func (p *prober) racer(round uint32, addr string) string {
	if p.shared == nil {
		mem, err := unix.Mmap(RaceFD, 0, RaceBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return result("", fmt.Errorf("race: map fd %d: %w", RaceFD, err))
		}
		p.shared = MapBarrier(mem)
	}
	fd, sa, err := p.socket(addr, false, unix.SOCK_STREAM, 0)
	if err != nil {
		return result("", err)
	}
	defer unix.Close(fd)
	if err := p.shared.arriveAndWait(round); err != nil {
		return result("", err)
	}
	return result("", unix.Connect(fd, sa))
}

// raceConnect has n OS threads connect to addr at the same instant (each
// with its socket made beforehand, released by a spin barrier) and counts
// the outcomes: "ok <allowed> <EPERM> <other>".
func raceConnect(p *prober, n int, addr string) string {
	type sock struct {
		fd int
		sa unix.Sockaddr
	}
	socks := make([]sock, 0, n)
	for i := 0; i < n; i++ {
		fd, sa, err := p.socket(addr, false, unix.SOCK_STREAM, 0)
		if err != nil {
			return result("", err)
		}
		defer unix.Close(fd)
		socks = append(socks, sock{fd, sa})
	}
	var w Barrier
	w.N.Store(uint32(n))
	res := make(chan error, n)
	for _, s := range socks {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := w.arriveAndWait(1); err != nil {
				res <- err
				return
			}
			res <- unix.Connect(s.fd, s.sa)
		}()
	}
	var ok, eperm, other int
	for range socks {
		switch err := <-res; {
		case err == nil:
			ok++
		case errors.Is(err, unix.EPERM):
			eperm++
		default:
			fmt.Fprintln(os.Stderr, "race:", err)
			other++
		}
	}
	return result(fmt.Sprintf("%d %d %d", ok, eperm, other), nil)
}
