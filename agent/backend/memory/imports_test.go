package memory_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStandardLibraryOnly: the memory backend and the conformance suite
// import the standard library and the seam only, so every GOOS builds them
// and no test that uses them pulls a kernel package in.
func TestStandardLibraryOnly(t *testing.T) {
	const module = "github.com/shinken-agent/shinken/"
	for _, pkg := range []string{"agent/backend/memory", "agent/backend/backendtest"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep != module+pkg && dep != module+"agent/backend" {
				t.Errorf("%s depends on %s: it must be standard library and agent/backend only", pkg, dep)
			}
		}
	}
}
