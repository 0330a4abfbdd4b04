//go:build linux

package main

// What the bench watches from the host while the phases run: the agent's
// resident memory, the host's free ephemeral ports (TCP and UDP counted
// apart), whether a host process can still take an ephemeral port, and the
// audit log's growth.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
	"golang.org/x/sys/unix"
)

type sample struct {
	at        time.Time
	rssKiB    int64
	tcpLeft   int // ports of ip_local_port_range no TCP socket holds
	udpLeft   int
	autobind  error // a host UDP socket's connect (autobind) to 127.0.0.1:9
	rangeSize int
	cpuTicks  int64    // the agent's user+system time, USER_HZ ticks
	aPorts    int      // ports of the range A's sockets hold (TCP or UDP, the more)
	aProcs    int      // processes of A's uid (the fork bomb's bound)
	cpu       [8]int64 // /proc/stat's cpu line: user nice system idle iowait irq softirq steal
}

type sampler struct {
	mu      sync.Mutex
	samples []sample
	stop    chan struct{}
	done    chan struct{}
}

// startSampler samples every period until stopped.
func startSampler(agentPID int, aUID uint32, period time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			x := sample{at: time.Now(), rssKiB: rssKiB(agentPID), cpuTicks: cpuTicks(agentPID), cpu: hostCPU()}
			lo, hi := portRange()
			x.rangeSize = hi - lo + 1
			tcp, tcpA := portsHeld(lo, hi, aUID, "/proc/net/tcp", "/proc/net/tcp6")
			udp, udpA := portsHeld(lo, hi, aUID, "/proc/net/udp", "/proc/net/udp6")
			x.tcpLeft, x.udpLeft, x.aPorts = x.rangeSize-tcp, x.rangeSize-udp, max(tcpA, udpA)
			x.autobind = autobind()
			x.aProcs = benchkit.CountProcsOf(aUID)
			s.mu.Lock()
			s.samples = append(s.samples, x)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) close() {
	close(s.stop)
	<-s.done
}

// window returns the samples taken in [from, to].
func (s *sampler) window(from, to time.Time) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sample
	for _, x := range s.samples {
		if !x.at.Before(from) && !x.at.After(to) {
			out = append(out, x)
		}
	}
	return out
}

type hostFigures struct {
	n                 int
	rssMaxKiB         int64
	portsLeftMin      int // the lower of TCP and UDP
	rangeSize         int
	autobindFailures  int
	autobindFirstFail string
	agentCPU          float64 // the agent's CPU time over the window's
	hostCPU           string  // the host's CPU time by kind, in CPUs
	aPortsMax         int
	aProcsMax         int
}

func summarize(xs []sample) hostFigures {
	h := hostFigures{n: len(xs), portsLeftMin: math.MaxInt}
	if len(xs) > 1 {
		first, last := xs[0], xs[len(xs)-1]
		secs := last.at.Sub(first.at).Seconds()
		h.agentCPU = float64(last.cpuTicks-first.cpuTicks) / 100 / secs
		var parts []string
		for i, k := range []string{"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"} {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(last.cpu[i]-first.cpu[i])/100/secs))
		}
		h.hostCPU = strings.Join(parts, " ")
	}
	for _, x := range xs {
		h.aPortsMax = max(h.aPortsMax, x.aPorts)
		h.aProcsMax = max(h.aProcsMax, x.aProcs)
		h.rssMaxKiB = max(h.rssMaxKiB, x.rssKiB)
		h.portsLeftMin = min(h.portsLeftMin, x.tcpLeft, x.udpLeft)
		h.rangeSize = x.rangeSize
		if x.autobind != nil {
			h.autobindFailures++
			if h.autobindFirstFail == "" {
				h.autobindFirstFail = x.autobind.Error()
			}
		}
	}
	return h
}

func rssKiB(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return -1
}

// cpuTicks is pid's utime+stime (/proc/PID/stat fields 14 and 15, in
// USER_HZ, 100 a second on Linux).
func cpuTicks(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(data, ')')
	f := strings.Fields(string(data[i+1:])) // f[0] is field 3
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

func hostCPU() (v [8]int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return v
	}
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])
	for i := 0; i < 8 && i+1 < len(f); i++ {
		v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	return v
}

func portRange() (int, int) {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	f := strings.Fields(string(data))
	if err != nil || len(f) != 2 {
		return 32768, 60999
	}
	lo, _ := strconv.Atoi(f[0])
	hi, _ := strconv.Atoi(f[1])
	return lo, hi
}

// portsHeld counts the distinct local ports in [lo, hi] of the sockets the
// files list (any state, TIME_WAIT included), in this network namespace:
// the host's, which sessions share; and those of sockets uid owns.
func portsHeld(lo, hi int, uid uint32, files ...string) (int, int) {
	seen, own := map[int]bool{}, map[int]bool{}
	us := strconv.FormatUint(uint64(uid), 10)
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 {
				continue
			}
			i := strings.LastIndexByte(fields[1], ':')
			port, err := strconv.ParseUint(fields[1][i+1:], 16, 16)
			if err == nil && int(port) >= lo && int(port) <= hi {
				seen[int(port)] = true
				if len(fields) > 7 && fields[7] == us {
					own[int(port)] = true
				}
			}
		}
		f.Close()
	}
	return len(seen), len(own)
}

func autobind() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}})
}

// auditSince returns the bytes of the audit log's records appended after
// offset that name session (and of all records), and the new end; byType
// (if not nil) gets session's records' bytes and count per event name.
func auditSince(path string, offset int64, session string, byType map[string][2]int64) (own, all, end int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, offset, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return 0, 0, offset, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return 0, 0, offset, err
	}
	// Only whole lines: a record being written is counted next time.
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	tag := []byte(`"session.id":"` + session + `"`)
	for _, l := range bytes.SplitAfter(data, []byte("\n")) {
		if bytes.Contains(l, tag) {
			own += int64(len(l))
			if byType != nil {
				var r struct {
					Event string `json:"event.name"`
				}
				json.Unmarshal(l, &r)
				x := byType[r.Event]
				byType[r.Event] = [2]int64{x[0] + int64(len(l)), x[1] + 1}
			}
		}
	}
	return own, int64(len(data)), offset + int64(len(data)), nil
}

func numCPU() int { return runtime.NumCPU() }
