package benchkit

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Mean of v (NaN for none).
func Mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// Q is the nearest-rank quantile p (0 < p ≤ 1) of sorted v; NaN for none.
func Q(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return v[max(0, int(math.Ceil(p*float64(len(v))))-1)]
}

// ParseLines reads a worker's output: lines "NAME V1 V2 ...", the values
// of one name gathered in order over all its lines.
func ParseLines(out string) (map[string][]float64, error) {
	got := map[string][]float64{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		for _, x := range f[1:] {
			v, err := strconv.ParseFloat(x, 64)
			if err != nil {
				return nil, fmt.Errorf("worker output %q: %v", l, err)
			}
			got[f[0]] = append(got[f[0]], v)
		}
	}
	return got, nil
}
