package agent

// Helpers the agent's tests share (the grammar's and the policy engine's
// tests keep their own in agent/capability and agent/policy).

import (
	"net/netip"
	"os"
	"testing"

	"github.com/shinken-agent/shinken/agent/shiftproof"
	"github.com/shinken-agent/shinken/agent/shiftproof/z3test"
)

func fsCap(read, write, deny []string) Capability {
	return Capability{Class: ClassFSScope, FS: &FSScope{Read: read, Write: write, Deny: deny}}
}

func egress(cidrs []string, ports []PortRange, domains ...string) Capability {
	c := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: domains, Ports: ports}}
	for _, s := range cidrs {
		c.Egress.CIDRs = append(c.Egress.CIDRs, netip.MustParsePrefix(s))
	}
	return c
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// needZ3: see z3test.Require (a failure under CI, a skip elsewhere).
func needZ3(t testing.TB) {
	t.Helper()
	z3test.Require(t, shiftproof.Z3Path)
}
