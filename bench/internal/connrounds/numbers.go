//go:build linux

package connrounds

import (
	"fmt"
	"log"
	"math"
	"sort"
	"strings"
)

// Rate turns the worker's "ok COUNT NS ..." into COUNT per second (0 on
// error, which the output then shows).
func Rate(line string) float64 {
	var n, ns int64
	f := strings.Fields(line)
	if _, err := fmt.Sscanf(strings.Join(f[:min(3, len(f))], " "), "ok %d %d", &n, &ns); err != nil || ns == 0 {
		log.Printf("worker: %s", line)
		return 0
	}
	return float64(n) / (float64(ns) / 1e9)
}

// CPURate turns "ok COUNT NS CPUNS" into COUNT per CPU-second.
func CPURate(line string) float64 {
	var n, ns, cpu int64
	if _, err := fmt.Sscanf(line, "ok %d %d %d", &n, &ns, &cpu); err != nil || cpu == 0 {
		return 0
	}
	return float64(n) / (float64(cpu) / 1e9)
}

// Pairs returns a[i]/b[i] for the rounds where both ran (a zero rate is a
// failed round and leaves no pair).
func Pairs(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

// MedianCI is the distribution-free 95 % confidence interval of the median
// (order statistics; normal approximation of the binomial ranks).
func MedianCI(v []float64) (lo, hi float64) {
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

// Median of v (0 for none).
func Median(v []float64) float64 {
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

// Pct is the p-th percentile of sorted (the value at index
// floor((n-1)·p/100)); 0 for none.
func Pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(float64(len(sorted)-1)*p/100)]
}

// PrintRates prints each contender's median rate and median CPU-rate,
// every line after indent.
func PrintRates(indent string, rounds int, secs float64, cs []*Contender) {
	fmt.Printf("%sconnect+close per second, %d rounds of %gs, median of rounds:", indent, rounds, secs)
	for _, c := range cs {
		fmt.Printf("  %s %.0f", c.Name, Median(c.Rate))
	}
	fmt.Printf("\n%s  per CPU-second of the worker:", indent)
	for _, c := range cs {
		fmt.Printf("  %s %.0f", c.Name, Median(c.CPU))
	}
	fmt.Println()
}

// Compare prints the per-round ratios of a to b (the median, its 95 %
// confidence interval, quartiles and extremes; then the median of the
// CPU-normalised ratios), every line after indent, and returns the ratios.
func Compare(indent, what string, a, b *Contender) []float64 {
	v := Pairs(a.Rate, b.Rate)
	if len(v) == 0 {
		fmt.Printf("%s  per-round ratio %s: no round gave both rates\n", indent, what)
		return v
	}
	lo, hi := MedianCI(v)
	q := append([]float64(nil), v...)
	sort.Float64s(q)
	fmt.Printf("%s  per-round ratio %s: median %.3f, 95%% CI %.3f–%.3f, quartiles %.3f %.3f, min %.3f max %.3f\n",
		indent, what, Median(v), lo, hi, Pct(q, 25), Pct(q, 75), q[0], q[len(q)-1])
	fmt.Printf("%s    CPU-normalised: median %.3f\n", indent, Median(Pairs(a.CPU, b.CPU)))
	return v
}
