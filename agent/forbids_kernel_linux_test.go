package agent

// The forbids and never-list cases of forbids_test.go on the real kernel:
// real connects from a probe in the session, to real listeners.

import "testing"

// TestForbidThroughTheKernel: testForbidInKernel with real connects.
func TestForbidThroughTheKernel(t *testing.T) {
	d, _ := newKernel(t)
	testForbidInKernel(t, d, probeReach(d), listenTCP(t, "127.0.0.7:0"))
}

// TestNeverExceptionFollowsPolicyKernel: testNeverFollowsPolicy with real
// connects.
func TestNeverExceptionFollowsPolicyKernel(t *testing.T) {
	d, _ := newKernel(t)
	testNeverFollowsPolicy(t, d, probeReach(d), listenTCP(t, "127.0.0.6:0"))
}
