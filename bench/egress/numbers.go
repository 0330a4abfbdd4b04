//go:build linux

package main

import (
	"fmt"
	"log"
	"math"
	"os"
	"sort"
	"strings"
)

// Numbers: rates, medians and their intervals, and the host facts printed
// with the results.

// cpuRate turns "ok COUNT NS CPUNS" into COUNT per CPU-second.
func cpuRate(line string) float64 {
	var n, ns, cpu int64
	if _, err := fmt.Sscanf(line, "ok %d %d %d", &n, &ns, &cpu); err != nil || cpu == 0 {
		return 0
	}
	return float64(n) / (float64(cpu) / 1e9)
}

func fmts(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return out
}

// rate turns "ok COUNT NS" into COUNT per second (0 on error, which the
// output then shows).
func rate(line string) float64 {
	var n, ns int64
	if _, err := fmt.Sscanf(strings.Join(strings.Fields(line)[:min(3, len(strings.Fields(line)))], " "), "ok %d %d", &n, &ns); err != nil || ns == 0 {
		log.Printf("worker: %s", line)
		return 0
	}
	return float64(n) / (float64(ns) / 1e9)
}

// pairs returns a[i]/b[i] for the rounds where both ran (a zero rate is a
// failed round and leaves no pair).
func pairs(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

// medianCI is the distribution-free 95 % confidence interval of the median
// (order statistics; normal approximation of the binomial ranks).
func medianCI(v []float64) (lo, hi float64) {
	n := len(v)
	if n == 0 {
		return 0, 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	d := 1.96 * math.Sqrt(float64(n)) / 2
	j := int(math.Floor(float64(n)/2 - d)) // 1-based rank
	k := int(math.Ceil(float64(n)/2 + d + 1))
	j = max(j, 1)
	k = min(k, n)
	return s[j-1], s[k-1]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mean(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

func numCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "\nprocessor") + 1
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.Index(l, ":"); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return "unknown CPU"
}

func kernelRelease() string {
	data, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(data))
}

// hostSockets counts the TCP and UDP sockets (v4 and v6) the sweep walks.
func hostSockets() int {
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if l := strings.Count(string(b), "\n"); l > 0 {
			n += l - 1
		}
	}
	return n
}
