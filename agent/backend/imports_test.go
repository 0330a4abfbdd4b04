package backend_test

import (
	"os/exec"
	"slices"
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
// the capability grammar and the API's wire types import only the standard
// library and the seam; the store imports those and atomicfile, never the
// agent that owns its records; the control plane, its API and the resolver
// reach the OS only through the seam (no Linux dataplane package, even
// transitively); the daemon and the CLI import no dataplane package
// directly (the daemon gets its backend from agent/backend/host); and the
// operator CLI links neither the policy engine nor the resolver: it speaks
// the API through agent/capability and agent/api/wire only.
func TestImportGraph(t *testing.T) {
	// Packages that may depend on nothing but the standard library and the
	// packages listed with them.
	for pkg, allowed := range map[string][]string{
		"agent/backend":    nil,
		"agent/capability": {"agent/backend"},
		"agent/api/wire":   {"agent/backend", "agent/capability"},
		"agent/store":      {"agent/backend", "agent/capability", "agent/internal/atomicfile"},
	} {
		for _, dep := range goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+pkg) {
			if dep != module+pkg && !slices.Contains(allowed, strings.TrimPrefix(dep, module)) {
				t.Errorf("%s depends on %s: it may import only the standard library and %v", pkg, dep, allowed)
			}
		}
	}
	for _, pkg := range []string{"agent", "agent/policy", "agent/api", "agent/metrics", "agent/audit", "dnsresolver", "cmd/shinkenctl"} {
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
	// The operator CLI and its panel are clients: neither the agent, its
	// server, the policy engine (Cedar, the shift prover) nor the resolver
	// (miekg/dns), even transitively.
	for _, pkg := range []string{"cmd/shinkenctl", "cmd/shinkenctl/panel"} {
		for _, dep := range goList(t, "-deps", module+pkg) {
			if why := clientForbids(dep); why != "" {
				t.Errorf("%s depends on %s (%s): a client speaks the API through agent/capability and agent/api/wire", pkg, dep, why)
			}
		}
	}
}

// clientForbids says why the operator CLI must not depend on dep ("" when
// it may).
func clientForbids(dep string) string {
	switch {
	case dep == module+"agent":
		return "the agent itself"
	case dep == module+"agent/api":
		return "the API server"
	case dep == module+"agent/policy", dep == module+"agent/shiftproof",
		dep == "github.com/cedar-policy/cedar-go", strings.HasPrefix(dep, "github.com/cedar-policy/cedar-go/"):
		return "the policy engine"
	case dep == module+"dnsresolver", dep == "github.com/miekg/dns", strings.HasPrefix(dep, "github.com/miekg/dns/"):
		return "the DNS resolver"
	}
	return ""
}

// TestShimImports holds the session runtime's shim (started for every
// session process, and four spares ahead) to the packages it needs: of the
// dataplane, the boundary's prepared launches and their locked thread
// only; never the boundary itself, go-seccomp-bpf (tables built at init),
// debug/elf, go-landlock or libcap's psx (a cgo package: the binary would
// be dynamically linked, with its loader and cgo set-up at every start),
// cilium/ebpf, the agent or the policy engine. Each of those cost every
// shim's start CPU (bench/README.md, issue 20).
func TestShimImports(t *testing.T) {
	allowed := []string{module + "dataplane/boundary/prepared", module + "dataplane/boundary/throwaway"}
	for _, dep := range goList(t, "-deps", module+"cmd/shinken-shim") {
		var why string
		switch {
		case strings.HasPrefix(dep, module+"dataplane") && !slices.Contains(allowed, dep):
			why = "the dataplane beyond the boundary's prepared launches"
		case strings.HasPrefix(dep, "github.com/elastic/go-seccomp-bpf"), dep == "debug/elf",
			strings.HasPrefix(dep, "github.com/landlock-lsm/go-landlock"), strings.HasPrefix(dep, "kernel.org/pub/linux/libs/security/libcap"),
			strings.HasPrefix(dep, "github.com/cilium/ebpf"):
			why = "a library of the boundary or the dataplane"
		case dep == module+"agent", dep == module+"agent/api", dep == module+"agent/backend/host", clientForbids(dep) != "":
			why = "the agent, its server, its backend or its policy engine"
		}
		if why != "" {
			t.Errorf("cmd/shinken-shim depends on %s (%s): a shim links the session runtime and the boundary's prepared launches only", dep, why)
		}
	}
}
