//go:build linux

package connrounds

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Contender is one cgroup the worker's connect rounds run in, and the
// rates it measured there, round by round.
type Contender struct {
	Name   string
	Cgroup string
	// On and Off, when set, run around each of its rounds: after the move,
	// before the idle pause, and after the round (an nftables rule that is
	// on only while its contender runs).
	On, Off func() error
	Rate    []float64 // connect+close per second
	CPU     []float64 // connect+close per CPU-second of the worker
}

// Rounds are the interleaved connect rounds: one worker, moved before each
// round into the next contender's cgroup, in rotating order (round r
// starts with contender r mod n), each round after the same idle pause.
// On a shared machine the load drifts from round to round, so the figure
// is the median of per-round ratios (each pair measured within one round
// of all contenders), not a ratio of medians; many short rounds pair the
// contenders closer in time than a few long ones.
type Rounds struct {
	Worker *Worker
	Server *Server
	Rounds int           // rounds per contender
	Secs   float64       // seconds per round
	Settle time.Duration // idle pause before every round
}

// Run runs the rounds over cs, appending to each contender's rates.
func (r Rounds) Run(cs []*Contender) error {
	flood := fmt.Sprintf("tcpflood 0 %s %g", r.Server.Addr, r.Secs)
	for n := 0; n < r.Rounds; n++ {
		for i := range cs {
			c := cs[(i+n)%len(cs)]
			if err := r.Worker.MoveTo(c.Cgroup); err != nil {
				return err
			}
			if c.On != nil {
				if err := c.On(); err != nil {
					return err
				}
			}
			time.Sleep(r.Settle)
			line := r.Worker.Do(flood)
			if c.Off != nil {
				if err := c.Off(); err != nil {
					return err
				}
			}
			c.Rate = append(c.Rate, Rate(line))
			c.CPU = append(c.CPU, CPURate(line))
		}
	}
	return nil
}

// Pin pins thread tid to CPU 0 when the server runs on another CPU (cpu,
// from ServerCPU, >= 0) and returns what restores its CPUs as they were.
func Pin(tid, cpu int) (restore func() error, err error) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &all); err != nil {
		return nil, err
	}
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return nil, fmt.Errorf("pin the worker to CPU 0: %w", err)
		}
	}
	return func() error { return unix.SchedSetaffinity(tid, &all) }, nil
}

// Baseline makes the baseline, an empty cgroup with nothing attached,
// root/<prefix>-base-<tag>, and with twin its twin, <prefix>-twin-<tag>:
// a second empty cgroup that runs the same rounds and measures the
// bench's own floor (an A/A comparison), the ratio the method reports
// when nothing differs. On an error it removes what it made.
func Baseline(root, prefix, tag string, twin bool) (base, twinCg string, err error) {
	base = filepath.Join(root, prefix+"-base-"+tag)
	if err := os.Mkdir(base, 0o755); err != nil {
		return "", "", err
	}
	if !twin {
		return base, "", nil
	}
	twinCg = filepath.Join(root, prefix+"-twin-"+tag)
	if err := os.Mkdir(twinCg, 0o755); err != nil {
		RmCgroup(base)
		return "", "", err
	}
	return base, twinCg, nil
}

// RmCgroup kills what is left in cgroup p (one the bench made) and removes
// it, waiting up to 3 seconds for its processes to go; "" is no cgroup.
func RmCgroup(p string) {
	if p == "" {
		return
	}
	os.WriteFile(filepath.Join(p, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 300; i++ {
		if err := unix.Rmdir(p); err == nil || errors.Is(err, unix.ENOENT) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "could not remove cgroup %s\n", p)
}
