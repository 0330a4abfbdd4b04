package dataplane

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/probe"
)

// raceRounds is how many times raceOnceProcesses re-arms one approve-once
// handle and races connects under it, within raceBudget (under emulation,
// as in .ci/vmtest, the budget ends it first). On this 2-CPU host a
// read-then-write consumption gave two winners in one round of about 150.
const (
	raceRounds = 4000
	raceBudget = 5 * time.Second
)

// raceOnceProcesses races connects under one approve-once handle from
// separate processes of session s, each pinned to its own CPU (one per CPU,
// 2 to 8), released together by a spin barrier in shared memory that the
// last racer to arrive opens: in every round exactly one connects and the
// others get EPERM. Between rounds the test re-arms the handle (state back
// to ONCE, same slot and generation: the write NewOnceHandle makes).
//
// A race only shows a non-atomic consumption when two racers land in the
// few instructions between the read and the write of the state word, so a
// pass here is evidence, not proof; TestOnceIsCompareAndSwap is the
// deterministic check of the compiled program.
func raceOnceProcesses(t *testing.T, d *Dataplane, s Session) {
	k := min(max(runtime.NumCPU(), 2), 8)
	mfd, err := unix.MemfdCreate("shinken-race", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	shared := os.NewFile(uintptr(mfd), "shinken-race")
	defer shared.Close()
	if err := shared.Truncate(probe.RaceBytes); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(mfd, 0, probe.RaceBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	words := probe.MapBarrier(mem)
	words.N.Store(uint32(k))

	racers := make([]*probe.Proc, k)
	for i := range racers {
		racers[i] = probe.Start(t, func(c *exec.Cmd) error {
			c.ExtraFiles = []*os.File{shared} // fd probe.RaceFD
			return StartIn(s, c, ProcOptions{})
		})
		if got := racers[i].Do("cpu " + strconv.Itoa(i%runtime.NumCPU())); got != "ok" {
			t.Fatalf("pin racer %d: %s", i, got)
		}
	}
	addr := "127.0.2.1"
	srv := listenTCP(t, addr+":0")
	h, err := d.NewOnceHandle(HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	mustAllow(t, d, s.Name, EgressRule{Prefix: pfx(addr + "/32"), Proto: ProtoTCP, Handle: h})

	answers := make(chan string, k)
	start := time.Now()
	round := uint32(1)
	for ; round <= raceRounds && time.Since(start) < raceBudget; round++ {
		if round > 1 { // re-arm
			v := shkShkHandle{State: uint32(HandleOnce), Generation: h.Generation}
			if err := d.objs.ShkHandles.Update(h.Slot, v, ebpf.UpdateExist); err != nil {
				t.Fatal(err)
			}
		}
		words.Ready.Store(0)
		cmd := "racer " + strconv.FormatUint(uint64(round), 10) + " " + srv.addr()
		for _, p := range racers {
			go func() { answers <- p.DoAsync(cmd) }()
		}
		var ok, eperm int
		var other []string
		for range racers {
			switch a := <-answers; a {
			case "ok":
				ok++
			case "err EPERM":
				eperm++
			default:
				other = append(other, a)
			}
		}
		if ok != 1 || eperm != k-1 {
			t.Fatalf("round %d: %d processes connecting at once under one approve-once handle: %d allowed, %d EPERM, other %q; want exactly 1 allowed",
				round, k, ok, eperm, other)
		}
		if st, err := d.HandleState(h); err != nil || st != HandleUsed {
			t.Fatalf("round %d: handle state %s (%v) after the race, want used", round, st, err)
		}
	}
	t.Logf("%d rounds of %d processes on %d CPUs in %v: exactly one connect each", round-1, k, runtime.NumCPU(), time.Since(start).Round(time.Millisecond))
}
