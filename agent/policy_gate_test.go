package agent

// Tests of the policy gate (apply, restart) and use-time decisions, on the
// memory backend (no root, any GOOS).

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const gpuAdmin = `@id("admin.gpu")
permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu")
when { principal.image == "trainer" && context.request.mode == "compute" };
`

// TestPolicyApplyGate: a change is applied when the solver proves it not
// wider, refused with a confirmed counterexample when it is wider (the disk
// and the live set unchanged), and applied with AllowWidening, audited.
func TestPolicyApplyGate(t *testing.T) {
	needZ3(t)
	d := memKernel(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "gpu.cedar"), gpuAdmin)
	ev := &eventLog{}
	a := openAgent(t, d, t.TempDir(), func(c *Config) { c.PolicyDir = dir; c.Events = ev })

	narrow := strings.Replace(gpuAdmin, `context.request.mode == "compute"`, `context.request.mode == "compute" && context.request.item == "0"`, 1)
	rep, err := a.ApplyPolicies(PolicyChange{Files: map[string]string{"gpu.cedar": narrow}, Actor: "test"})
	if err != nil || !rep.Applied || rep.Widens || rep.Shift.Solver != "unsat" {
		t.Fatalf("narrowing: %+v, %v", rep, err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "gpu.cedar")); string(data) != narrow {
		t.Fatal("the applied file is not on disk")
	}
	wide := strings.Replace(gpuAdmin, `principal.image == "trainer" && `, "", 1)
	diff, err := a.PolicyDiff(PolicyChange{Files: map[string]string{"gpu.cedar": wide}})
	if err != nil || !diff.Widens || diff.Applied || diff.Shift.Counterexample == nil {
		t.Fatalf("diff of a widening: %+v, %v", diff, err)
	}
	rep, err = a.ApplyPolicies(PolicyChange{Files: map[string]string{"gpu.cedar": wide}, Actor: "test"})
	if !errors.Is(err, ErrPolicyWidens) || rep == nil || rep.Applied || rep.Shift.Counterexample == nil || !strings.Contains(err.Error(), "admin.gpu") {
		t.Fatalf("widening apply: %+v, %v; want refused with a counterexample", rep, err)
	}
	t.Logf("refused: %v", err)
	if data, _ := os.ReadFile(filepath.Join(dir, "gpu.cedar")); string(data) != narrow {
		t.Fatal("a refused change reached the disk")
	}
	mustSession(t, a, SessionSpec{ID: "s1", Image: "py"})
	if dec, _ := a.DecideUse("s1", UseRequest{Class: ClassGPU, Op: "use", Item: "0", Mode: "compute"}); dec.Allowed {
		t.Fatal("a refused change is in force")
	}
	rep, err = a.ApplyPolicies(PolicyChange{Files: map[string]string{"gpu.cedar": wide}, AllowWidening: true, Actor: "test"})
	if err != nil || !rep.Applied || !rep.Widens {
		t.Fatalf("apply with AllowWidening: %+v, %v", rep, err)
	}
	dec, _ := a.DecideUse("s1", UseRequest{Class: ClassGPU, Op: "use", Item: "0", Mode: "compute"})
	if !dec.Allowed || dec.DecidedBy != "admin.gpu" {
		t.Fatalf("after the accepted widening: %+v", dec)
	}
	var audited []string
	for _, e := range ev.ev {
		if e.Kind == "policy.apply" {
			audited = append(audited, e.Outcome)
		}
	}
	if len(audited) != 3 || !strings.Contains(audited[2], "allow-widening") || !strings.Contains(audited[2], "may now use gpu") {
		t.Fatalf("policy.apply events %q: want applied, refused, applied with the counterexample", audited)
	}
}

// TestPolicyRestartWidening: a policy directory widened while the agent was
// down refuses the start, unless AcceptPolicyWidening (audited); a narrowed
// one starts.
func TestPolicyRestartWidening(t *testing.T) {
	needZ3(t)
	d := memKernel(t)
	dir, state := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(dir, "gpu.cedar"), gpuAdmin)
	a := openAgent(t, d, state, func(c *Config) { c.PolicyDir = dir })
	a.Close()
	writeFile(t, filepath.Join(dir, "gpu.cedar"), strings.Replace(gpuAdmin, `principal.image == "trainer" && `, "", 1))
	cfg := Config{StateDir: state, Kernel: d, Manifests: testManifests(t), Logger: quiet, Events: &eventLog{}, PolicyDir: dir}
	if _, err := Open(cfg); !errors.Is(err, ErrPolicyWidens) || !strings.Contains(err.Error(), "accept-policy-widening") {
		t.Fatalf("restart with a widened directory: %v", err)
	}
	ev := &eventLog{}
	cfg.AcceptPolicyWidening, cfg.Events = true, ev
	b, err := Open(cfg)
	if err != nil {
		t.Fatalf("restart accepting the widening: %v", err)
	}
	if k := ev.kinds(); !strings.Contains(strings.Join(k, ","), "policy.restart") {
		t.Fatalf("accepted widening not audited: %v", k)
	}
	b.Close()
	// the accepted set is now the last applied: a narrower one starts plainly
	writeFile(t, filepath.Join(dir, "gpu.cedar"), gpuAdmin)
	cfg.AcceptPolicyWidening = false
	c, err := Open(cfg)
	if err != nil {
		t.Fatalf("restart with a narrowed directory: %v", err)
	}
	c.Close()
}

// TestDecideUse: use-time decisions name the rule that decided: a live
// grant, a hard-deny forbid, or the default deny.
func TestDecideUse(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "s1", Home: "/home/agent"})
	g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: loopEgress("127.0.0.2:443"), Lifecycle: LifecycleSession})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := a.DecideUse("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("127.0.0.2"), Port: 443})
	if err != nil || !dec.Allowed || dec.DecidedBy != "grant:"+g.ID {
		t.Fatalf("granted egress: %+v, %v", dec, err)
	}
	if dec, _ = a.DecideUse("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("127.0.0.2"), Port: 80}); dec.Allowed || dec.DecidedBy != DefaultDeny {
		t.Fatalf("other port: %+v", dec)
	}
	if dec, _ = a.DecideUse("s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/.ssh/authorized_keys"}); dec.Allowed || dec.DecidedBy != "hard.fs-protected.use" {
		t.Fatalf("write to ~/.ssh: %+v", dec)
	}
	if err := a.Revoke(ctx, g.Handle); err != nil {
		t.Fatal(err)
	}
	if dec, _ = a.DecideUse("s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("127.0.0.2"), Port: 443}); dec.Allowed {
		t.Fatalf("after revoke: %+v", dec)
	}
}
