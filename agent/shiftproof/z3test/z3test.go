// Package z3test is the tests' check for the z3 solver that the policy
// gate's permissiveness proof runs (package shiftproof). Only tests import
// it.
package z3test

import (
	"os"
	"os/exec"
	"testing"
)

// Require stops a test that needs the solver at path (shiftproof.Z3Path)
// when it is not installed. Under CI (CI set, as .ci/run sets it, and
// .ci/install-deps installs z3) that is a failure, so the proofs' tests are
// never skipped there; elsewhere the test is skipped with the reason.
func Require(t testing.TB, path string) {
	t.Helper()
	if _, err := exec.LookPath(path); err == nil {
		return
	}
	const why = "z3 not installed (apt-get install z3; .ci/install-deps installs it)"
	if os.Getenv("CI") != "" {
		t.Fatalf("%s: %q not found, and CI is set: a test of the proof must not be skipped under CI", why, path)
	}
	t.Skip(why)
}
