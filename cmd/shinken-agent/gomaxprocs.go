package main

import (
	"fmt"
	"os"
	"runtime"
)

// The Go scheduler runs goroutines on GOMAXPROCS processors (Ps), by
// default one per CPU the agent may use. A goroutine in a blocking system
// call keeps its P until the call returns or the runtime's monitor (sysmon)
// takes the P back, which it does only on its second look, 20 µs to 10 ms
// apart. The agent parks some goroutines in blocking calls that return at
// every event: the DNS resolver's UDP workers (recvmmsg(2), one thread each:
// dnsresolver.Resolver.ParkedWorkers) and the kernel event ring's reader
// (epoll_wait(2)). Each such wake-up takes a P, and the worker goes back to
// sleep holding it. On a 2-CPU host the resolver's three workers could hold
// both Ps while asleep, and every other goroutine (a query's upstream
// exchange, an API request, a grant) then waited for the monitor: in
// bench-neighbor's idle phases a new name's DNS p99 was 11–13 ms against a
// median of 0.8, and B's grant p99 9–11 ms; with the Ps raised by the parked
// goroutines, 2.8–3.1 and 5.6–6.7 (bench/README.md, thirty-first session).
//
// raiseProcs adds parked to GOMAXPROCS. An operator's GOMAXPROCS is left
// alone. The Ps of the parked goroutines run Go code only between their
// system calls, so the agent's goroutines still run on at most the
// runtime's default number of CPUs at once, plus those.
type procsRaise struct {
	base, parked int
	operator     bool // GOMAXPROCS set in the environment: left alone
}

func raiseProcs(parked int) procsRaise {
	p := procsRaise{base: runtime.GOMAXPROCS(0), parked: parked, operator: os.Getenv("GOMAXPROCS") != ""}
	if !p.operator && parked > 0 {
		runtime.GOMAXPROCS(p.base + parked)
	}
	return p
}

// fact is the status report's line.
func (p procsRaise) fact() string {
	if p.operator {
		return fmt.Sprintf("GOMAXPROCS %d, the operator's (GOMAXPROCS in the environment): not raised by the %d goroutines parked in blocking system calls", runtime.GOMAXPROCS(0), p.parked)
	}
	return fmt.Sprintf("GOMAXPROCS %d: the runtime's %d and one for each of the %d goroutines parked in blocking system calls (the DNS resolver's UDP workers, the kernel event reader), which hold a processor while they sleep", runtime.GOMAXPROCS(0), p.base, p.parked)
}
