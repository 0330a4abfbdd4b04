//go:build linux

package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// TestGoProcs: the agent adds a Go processor for each goroutine it parks
// in a blocking system call (the resolver's UDP workers: one per socket
// and the penalty socket's; the kernel event reader), so that they cannot
// hold every processor while they sleep, and status says so from the
// running value; an operator's GOMAXPROCS is left alone.
func TestGoProcs(t *testing.T) {
	e := newEnv(t)
	status := func() string { return e.statusString("agent_go_procs") }
	if os.Getenv("GOMAXPROCS") == "" {
		e.startAgent()
		got := status()
		var total, base, parked int
		if _, err := fmt.Sscanf(got, "GOMAXPROCS %d: the runtime's %d and one for each of the %d goroutines", &total, &base, &parked); err != nil {
			t.Fatalf("agent_go_procs %q: %v", got, err)
		}
		// The resolver's sockets: one per CPU (at most 16) and the
		// penalty socket, one worker each; and the event reader.
		wantParked := min(runtime.NumCPU(), 16) + 1 + 1
		if base != runtime.GOMAXPROCS(0) || parked != wantParked || total != base+parked {
			t.Errorf("agent_go_procs %q: want the runtime's %d raised by %d", got, runtime.GOMAXPROCS(0), wantParked)
		}
		e.stopAgent(syscall.SIGTERM)
	}
	e.env = []string{"GOMAXPROCS=3"}
	e.startAgent()
	if got := status(); !strings.HasPrefix(got, "GOMAXPROCS 3, the operator's") {
		t.Errorf("agent_go_procs with GOMAXPROCS=3 in the environment: %q", got)
	}
}
