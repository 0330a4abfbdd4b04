// Package benchkit holds what the benches (bench/*) share: the host line
// they print (load, kernel, CPUs), the host's and processes' figures they
// read from /proc (meminfo, the kernel's memory, process count, a
// process's RSS and Pss), the clock and quantiles they time with, the
// name-value lines their workers print and read, and a helper process run
// from the bench's own binary (a fake upstream).
package benchkit
