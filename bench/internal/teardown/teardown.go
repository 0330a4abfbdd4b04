// Package teardown runs a bench's cleanups (its cgroups, pins, sessions,
// processes and directories): each once, whoever calls it first, the last
// registered first, at the run's end or when SIGINT, SIGTERM or SIGHUP
// arrives; after a signal the process exits 130, and a second signal
// kills it, leaving what was not cleaned yet.
package teardown

import (
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

var (
	mu    sync.Mutex
	steps []*step
)

type step struct {
	once sync.Once
	f    func()
}

func (s *step) run() { s.once.Do(s.f) }

// Add registers f and returns the function that runs it: once, whether
// the run's end or a signal calls it first; a concurrent caller waits for
// it to finish.
func Add(f func()) func() {
	mu.Lock()
	defer mu.Unlock()
	s := &step{f: f}
	steps = append(steps, s)
	return s.run
}

// OnSignal makes the first SIGINT, SIGTERM or SIGHUP log "SIGNAL: cleaning
// up" and note, run every registered cleanup not yet run (the last
// registered first) and exit 130. The signals' default action is restored
// first, so that a second one kills the process.
func OnSignal(note string) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		sig := <-ch
		signal.Reset()
		log.Printf("%v: cleaning up%s", sig, note)
		mu.Lock()
		for i := len(steps) - 1; i >= 0; i-- {
			steps[i].run()
		}
		os.Exit(130)
	}()
}
