package backend_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/shinken-agent/shinken/"

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// TestImportGraph holds the layering: the seam is standard library only;
// the control plane, its API and the resolver reach the OS only through the
// seam (no Linux dataplane package, even transitively); the daemon and the
// CLI import no dataplane package directly (the daemon gets its backend from
// agent/backend/host).
func TestImportGraph(t *testing.T) {
	for _, dep := range goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+"agent/backend") {
		if dep != module+"agent/backend" {
			t.Errorf("agent/backend depends on %s: the seam must be standard library only", dep)
		}
	}
	for _, pkg := range []string{"agent", "agent/api", "agent/metrics", "agent/audit", "dnsresolver", "cmd/shinkenctl"} {
		for _, dep := range goList(t, "-deps", module+pkg) {
			if strings.HasPrefix(dep, module+"dataplane") {
				t.Errorf("%s depends on %s: it must reach the OS through agent/backend", pkg, dep)
			}
		}
	}
	for _, pkg := range []string{"cmd/shinken-agent", "cmd/shinkenctl"} {
		for _, imp := range goList(t, "-f", `{{join .Imports " "}}`, module+pkg) {
			if strings.HasPrefix(imp, module+"dataplane") {
				t.Errorf("%s imports %s directly: open the backend through agent/backend/host", pkg, imp)
			}
		}
	}
}
