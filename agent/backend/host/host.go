// Package host opens the enforcement backend of the operating system the
// binary was built for: the BPF dataplane on Linux, backend.Unsupported (with
// an error saying so) elsewhere. It is the one place that names a concrete
// backend, so the daemon, the API and the resolver depend on the seam alone.
package host
