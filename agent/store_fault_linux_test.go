package agent

import "testing"

// TestStoreFaultsKernel runs the store's fault injection against the Linux
// dataplane (root); the memory backend runs the same cases without root.
func TestStoreFaultsKernel(t *testing.T) {
	testStoreFaults(t, func(t *testing.T) Kernel {
		d, _ := newKernel(t)
		return d
	})
}
