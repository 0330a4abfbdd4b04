//go:build linux

package main

import (
	"fmt"
	"os"
	"strings"
)

// Numbers: the host facts printed with the results (the rates, medians and
// intervals of the rounds are connrounds').

func fmts(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return out
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
