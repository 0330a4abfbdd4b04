// Package benchkit holds what the benches (bench/*) share: the host line
// they print (load, kernel, CPUs), the clock and quantiles they time with, the
// name-value lines their workers print, and a helper process run from the
// bench's own binary (a fake upstream).
package benchkit
