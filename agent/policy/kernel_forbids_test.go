package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// forbidEngine is an engine whose policy directory holds policies, with
// session s1 holding a net.egress grant of every IPv4 and IPv6 address and
// port: Decide then denies exactly what a forbid refuses.
func forbidEngine(t testing.TB, policies ...string) *Engine {
	t.Helper()
	dir := t.TempDir()
	writeFile(t.(*testing.T), filepath.Join(dir, "admin.cedar"), strings.Join(policies, "\n"))
	e := newTestEngine(t.(*testing.T), dir)
	e.PutSession(testSession("s1"))
	if err := e.PutGrant(GrantData{ID: "g1", Session: "s1", Capability: egress([]string{"0.0.0.0/0", "::/0"}, nil)}); err != nil {
		t.Fatal(err)
	}
	return e
}

var (
	forbidCIDRs = []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "0.0.0.0/0", "192.168.0.0/16",
		"127.0.0.0/8", "2001:db8::/32", "2001:db8:1::/48", "::/0", "::1/128",
		"10.1.0.1/16", "::ffff:10.0.0.0/104", "010.0.0.0/8"} // the last three are spelled as no request key is
	forbidBlocks = []string{"443/16", "80/16", "0/0", "8000/13", "0/6", "1024/6", "443/15", "0443/16", "65535/16"}
	forbidAddrs  = []string{"10.1.2.3", "10.1.2.4", "10.1.3.1", "10.2.0.1", "11.0.0.1", "192.168.1.1", "127.0.0.1",
		"2001:db8::1", "2001:db8:1::5", "2001:db9::1", "::ffff:10.1.2.3", "::ffff:192.168.7.7", "::1", "::2"}
	forbidPorts = []uint16{443, 80, 8003, 8008, 22, 1023, 1024, 65535, 0}
)

// randForbid is a forbid of the shapes the kernel can hold.
func randForbid(r *rand.Rand, id int) string {
	action := []string{`action == Shinken::Action::"use"`, `action in Shinken::Action::"use"`, `action in [Shinken::Action::"use"]`}[r.IntN(3)]
	resource := []string{`resource == Shinken::Capability::"net.egress"`, `resource`, `resource is Shinken::Capability`}[r.IntN(3)]
	principal := []string{`principal`, `principal is Shinken::Session`}[r.IntN(2)]
	var cond func(depth int) string
	cond = func(depth int) string {
		k := r.IntN(9)
		if depth > 2 {
			k = r.IntN(4)
		}
		switch k {
		case 0:
			return fmt.Sprintf(`context.request.cidr_keys.contains(%q)`, forbidCIDRs[r.IntN(len(forbidCIDRs))])
		case 1:
			return fmt.Sprintf(`context.request.cidr_keys.containsAny([%q, %q])`, forbidCIDRs[r.IntN(len(forbidCIDRs))], forbidCIDRs[r.IntN(len(forbidCIDRs))])
		case 2:
			return fmt.Sprintf(`context.request.port_keys.contains(%q)`, forbidBlocks[r.IntN(len(forbidBlocks))])
		case 3:
			return fmt.Sprintf(`context.request.port_keys.containsAny([%q, %q])`, forbidBlocks[r.IntN(len(forbidBlocks))], forbidBlocks[r.IntN(len(forbidBlocks))])
		case 4, 5:
			return "(" + cond(depth+1) + " && " + cond(depth+1) + ")"
		case 6, 7:
			return "(" + cond(depth+1) + " || " + cond(depth+1) + ")"
		}
		return []string{`context.request.op == "connect"`, `context.request.op == "write"`, `true`, `!false`}[r.IntN(4)]
	}
	unless := ""
	if r.IntN(5) == 0 {
		unless = ` unless { false }`
	}
	return fmt.Sprintf("@id(\"admin.f%d\") forbid (%s, %s, %s) when { %s }%s;", id, principal, action, resource, cond(0), unless)
}

// TestKernelForbidsExact: for random sets of forbids of the shapes the
// kernel holds, the deny table refuses an address and port exactly when
// Decide (the production request encoding, the pruned key lengths
// included) denies it under a grant of everything (the shipped
// hard.egress-no-tls.use, which reads the session's attributes, is decide
// time only and false for this session): v4, v6, v4-mapped,
// literals no key is spelled as, port blocks aligned or not.
func TestKernelForbidsExact(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	cases := 0
	for set := range 150 {
		var ps []string
		for i := range 1 + r.IntN(4) {
			ps = append(ps, randForbid(r, i))
		}
		e := forbidEngine(t, ps...)
		kf := e.KernelForbids()
		if len(kf.DecideOnly) != 1 || kf.DecideOnly[0].ID != "hard.egress-no-tls.use" {
			t.Fatalf("seed %d set %d: %v reported decide-time only:\n%s", seed, set, kf.DecideOnly, strings.Join(ps, "\n"))
		}
		table, err := backend.DenyTable(kf.Entries)
		if err != nil {
			t.Fatalf("seed %d set %d: %v", seed, set, err)
		}
		for _, a := range forbidAddrs {
			for _, port := range forbidPorts {
				ip := netip.MustParseAddr(a)
				d, err := e.Decide("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ip, Port: port}, t0)
				if err != nil {
					continue // a request Decide refuses to evaluate (port 0)
				}
				cases++
				if kernel := backend.Denied(table, ip, port); kernel == d.Allowed {
					t.Fatalf("seed %d set %d: %s port %d: decide allowed=%v (%v), deny table denied=%v (entries %v)\n%s",
						seed, set, a, port, d.Allowed, d.Reasons, kernel, kf.Entries, strings.Join(ps, "\n"))
				}
			}
		}
	}
	t.Logf("%d cases", cases)
}

// TestKernelForbidsDecideOnly: the forbids the kernel cannot hold are
// reported with why; the ones that never apply to net.egress are not
// reported; the shipped hard-deny forbids are classified.
func TestKernelForbidsDecideOnly(t *testing.T) {
	e := forbidEngine(t,
		`@id("admin.one-session") forbid (principal == Shinken::Session::"s1", action == Shinken::Action::"use", resource) when { context.request.cidr_keys.contains("10.0.0.0/8") };`,
		`@id("admin.by-name") forbid (principal, action == Shinken::Action::"use", resource) when { context.request.domain_keys.contains("evil.example") };`,
		`@id("admin.not-cidr") forbid (principal, action == Shinken::Action::"use", resource) when { !context.request.cidr_keys.contains("10.0.0.0/8") };`,
		`@id("admin.unless") forbid (principal, action == Shinken::Action::"use", resource) unless { context.request.cidr_keys.contains("10.0.0.0/8") };`,
		`@id("admin.fs-only") forbid (principal, action, resource == Shinken::Capability::"fs.scope");`,
		`@id("admin.grant-only") forbid (principal, action == Shinken::Action::"grant", resource);`,
		`@id("admin.write-op") forbid (principal, action == Shinken::Action::"use", resource) when { context.request.op == "write" && context.request.domain_keys.contains("x") };`,
		`@id("admin.kernel") forbid (principal, action == Shinken::Action::"use", resource) when { context.request.cidr_keys.contains("10.0.0.0/8") && context.request.port_keys.contains("443/16") };`,
	)
	kf := e.KernelForbids()
	got := map[string]string{}
	for _, d := range kf.DecideOnly {
		got[d.ID] = d.Why
	}
	for _, id := range []string{"admin.one-session", "admin.by-name", "admin.not-cidr", "admin.unless", "hard.egress-no-tls.use"} {
		if got[id] == "" {
			t.Errorf("%s: not reported as decide-time only (report %v)", id, kf.DecideOnly)
		}
	}
	for _, id := range []string{"admin.fs-only", "admin.grant-only", "admin.write-op", "admin.kernel", "hard.fs-protected.use", "hard.policy-store.use"} {
		if _, ok := got[id]; ok {
			t.Errorf("%s reported decide-time only: %s", id, got[id])
		}
	}
	if fmt.Sprint(kf.Kernel) != "[admin.kernel]" || fmt.Sprint(kf.Entries) != "[10.0.0.0/8 port 443]" {
		t.Errorf("kernel %v entries %v, want [admin.kernel] [10.0.0.0/8 port 443]", kf.Kernel, kf.Entries)
	}
}
