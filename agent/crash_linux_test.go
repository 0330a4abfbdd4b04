package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// The crash test re-executes the test binary as an agent process, kills it
// with SIGKILL right after a chosen step of GRANT or REVOKE, then opens the
// dataplane and the agent again and checks that reconcile left state and
// kernel in agreement, in the fail-closed direction, and that nothing revoked
// came back. Their memory twins, without root, are memory_crash_test.go.

const crashChildEnv = "SHINKEN_AGENT_CRASH_CHILD"

type discardSink struct{}

func (discardSink) Emit(Event) error { return nil }

func crashChildMain() {
	cfg := kernelConfig()
	cfg.Parent, cfg.PinPath = os.Getenv("SHK_PARENT"), os.Getenv("SHK_PIN")
	d, err := dataplane.Open(cfg)
	if err != nil {
		fmt.Println("child: open dataplane:", err)
		os.Exit(3)
	}
	ms, err := ParseManifests("test.manifest", []byte(testManifest))
	if err != nil {
		fmt.Println("child:", err)
		os.Exit(3)
	}
	// SHK_STEP is "step" or "step#n": crash at the n-th time the step is
	// reached (steps inside loops, such as revoke.released, recur). A
	// "step%k" crashes at step as a backend would die inside one Apply or
	// Release: with k more address rules applied (grant) or released
	// (revoke) than the agent recorded as done.
	stepName, nth, _ := strings.Cut(os.Getenv("SHK_STEP"), "#")
	stepName, partial, _ := strings.Cut(stepName, "%")
	step := Step(stepName)
	k, _ := strconv.Atoi(partial)
	want, _ := strconv.Atoi(nth)
	want = max(want, 1)
	seen := 0
	a, err := Open(Config{StateDir: os.Getenv("SHK_STATE"), Kernel: d, Manifests: map[string]*Manifest{"py": ms[0]}, Logger: quiet, Events: discardSink{},
		CrashHook: func(s Step) {
			if s == step {
				if seen++; seen < want {
					return
				}
				if k > 0 {
					crashPartly(d, k)
				}
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}})
	if err != nil {
		fmt.Println("child: open agent:", err)
		os.Exit(3)
	}
	switch os.Getenv("SHK_OP") {
	case "grant":
		_, err = a.Grant(context.Background(), GrantRequest{Session: "s1", Capability: crashCap(os.Getenv("SHK_X"), os.Getenv("SHK_Y")), Lifecycle: LifecycleSession})
	case "revoke":
		err = a.Revoke(context.Background(), os.Getenv("SHK_TOKEN"))
	case "session":
		err = a.CreateSession(SessionSpec{ID: "s2", Image: "py"})
	}
	fmt.Println("child: finished without crashing:", err)
	os.Exit(4)
}

// crashPartly does what a backend killed inside Apply or Release leaves:
// the first k rules of the grant (whose handle is the one live in the
// kernel) added, or the first k rules of session s1 removed once the
// grant's handle is revoked.
func crashPartly(d *dataplane.Dataplane, k int) {
	hs, _ := d.Handles()
	for _, h := range hs {
		if os.Getenv("SHK_OP") == "grant" && h.State == backend.HandleLive {
			rules := capability.Compile(crashCap(os.Getenv("SHK_X"), os.Getenv("SHK_Y")), h.Ref).AddressRules()
			if err := d.Apply("s1", backend.DeltaOf(rules[:k])); err != nil {
				fmt.Println("child: partial apply:", err)
				os.Exit(3)
			}
			return
		}
	}
	rules, _ := d.EgressRules("s1")
	if err := d.Release("s1", backend.HandleRef{}, backend.DeltaOf(rules[:min(k, len(rules))])); err != nil {
		fmt.Println("child: partial release:", err)
		os.Exit(3)
	}
}

// checkAgree: every live grant has its kernel handle live and all its rules
// present; no other kernel handle is live; no other rule exists.
func checkAgree(t *testing.T, a *Agent, k Kernel, session string) (liveGrants int) {
	t.Helper()
	live := liveHandles(t, k)
	rules := kernelRules(t, k, session)
	accounted := 0
	for _, g := range a.Grants("") {
		if g.Phase != PhaseLive {
			if slices.ContainsFunc(live, func(h dataplane.Handle) bool { return h.Ref == g.Kernel }) {
				t.Errorf("grant %s is %s but its kernel handle %s is live", g.ID[:8], g.Phase, g.Kernel)
			}
			if slices.ContainsFunc(rules, func(r dataplane.EgressRule) bool { return r.Handle == g.Kernel && !g.Kernel.IsZero() }) {
				t.Errorf("grant %s is %s but kernel rules carry its handle", g.ID[:8], g.Phase)
			}
			continue
		}
		liveGrants++
		if !slices.ContainsFunc(live, func(h dataplane.Handle) bool { return h.Ref == g.Kernel }) {
			t.Errorf("live grant %s: kernel handle %s not live", g.ID[:8], g.Kernel)
		}
		for _, r := range capability.Compile(g.Capability, g.Kernel).AddressRules() {
			if !slices.ContainsFunc(rules, func(k dataplane.EgressRule) bool { return backend.SameRule(k, r) }) {
				t.Errorf("live grant %s: rule %s missing", g.ID[:8], r)
			}
			accounted++
		}
	}
	if len(live) != liveGrants {
		t.Errorf("%d live kernel handles for %d live grants", len(live), liveGrants)
	}
	if len(rules) != accounted {
		t.Errorf("%d kernel rules, %d accounted for by live grants", len(rules), accounted)
	}
	return liveGrants
}

func runCrashChild(t *testing.T, cfg dataplane.Config, dir string, step string, env ...string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append([]string{crashChildEnv + "=1", "SHK_PARENT=" + cfg.Parent, "SHK_PIN=" + cfg.PinPath, "SHK_STATE=" + dir, "SHK_STEP=" + step}, env...)
	out, _ := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed at %s: %v\n%s", step, cmd.ProcessState, out)
	}
}

func TestCrashGrant(t *testing.T) {
	kerneltest.RequireRoot(t)
	var steps []string
	for _, s := range GrantSteps {
		steps = append(steps, string(s))
		if s == StepGrantApplying { // four rules: a backend dying after each
			steps = append(steps, string(s)+"%1", string(s)+"%2", string(s)+"%3", string(s)+"%4")
		}
	}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			d, cfg := newKernel(t)
			dir := t.TempDir()
			a := openAgent(t, d, dir)
			mustSession(t, a, SessionSpec{ID: "s1"})
			x := listenTCP(t, "127.0.0.2:0")
			y := listenTCP(t, "127.0.0.3:0")
			d.Close() // the agent process owns the dataplane now
			runCrashChild(t, cfg, dir, step, "SHK_OP=grant", "SHK_X="+x, "SHK_Y="+y)

			d2, err := dataplane.Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			a2 := openAgent(t, d2, dir, func(c *Config) { c.Events = discardSink{} })
			wantLive := step == string(StepGrantLive) || step == string(StepGrantEmitted)
			n := checkAgree(t, a2, d2, "s1")
			if (n == 1) != wantLive || n > 1 {
				t.Fatalf("after a crash at %s: %d live grants, want live=%v", step, n, wantLive)
			}
			want := "err EPERM"
			if wantLive {
				want = "ok"
			}
			p := startProbe(t, d2, "s1")
			for _, dst := range []string{x, y} {
				if got := p.DoAsync("tcp " + dst); got != want {
					t.Errorf("after a crash at %s: tcp %s = %s, want %s", step, dst, got, want)
				}
			}
			// Reconcile converged: a second pass repairs nothing.
			rep, err := a2.Reconcile()
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.RolledBack)+len(rep.Revoked)+len(rep.OrphanHandles)+rep.OrphanRules+len(rep.OrphanSessions)+len(rep.EndedSessions) != 0 {
				t.Fatalf("second reconcile repaired %+v", rep)
			}
		})
	}
}

func TestCrashRevoke(t *testing.T) {
	kerneltest.RequireRoot(t)
	var steps []string
	for _, s := range RevokeSteps {
		steps = append(steps, string(s))
		if s == StepRevokePolicy { // four rules in s1: a backend dying after each
			steps = append(steps, string(s)+"%1", string(s)+"%2", string(s)+"%4")
		}
		if s == StepRevokeReleased { // two grants: the descendant, then the root
			steps = append(steps, string(s)+"#2")
		}
	}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			d, cfg := newKernel(t)
			dir := t.TempDir()
			a := openAgent(t, d, dir)
			mustSession(t, a, SessionSpec{ID: "s1"})
			mustSession(t, a, SessionSpec{ID: "sub"})
			x := listenTCP(t, "127.0.0.2:0")
			y := listenTCP(t, "127.0.0.3:0")
			g, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: crashCap(x, y), Lifecycle: LifecycleSession})
			if err != nil {
				t.Fatal(err)
			}
			// A descendant in another session: the membrane must hold too.
			if _, err := a.Attenuate(ctx, g.Handle, GrantRequest{Session: "sub", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
				t.Fatal(err)
			}
			d.Close()
			runCrashChild(t, cfg, dir, step, "SHK_OP=revoke", "SHK_TOKEN="+g.Handle)

			d2, err := dataplane.Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			a2 := openAgent(t, d2, dir, func(c *Config) { c.Events = discardSink{} })
			for _, s := range []string{"s1", "sub"} {
				if n := checkAgree(t, a2, d2, s); n != 0 {
					t.Fatalf("after a crash at %s: %d live grants in %s", step, n, s)
				}
				p := startProbe(t, d2, s)
				for _, dst := range []string{x, y} {
					if got := p.DoAsync("tcp " + dst); got != "err EPERM" {
						t.Errorf("after a crash at %s: %s reaches %s (%s): a revoked grant came back", step, s, dst, got)
					}
				}
			}
			for _, gi := range a2.Grants("") {
				if gi.Phase != PhaseRevoked {
					t.Errorf("grant %s is %s", gi.ID[:8], gi.Phase)
				}
			}
			if err := a2.Revoke(ctx, g.Handle); err != nil {
				t.Fatalf("revoke again after recovery: %v", err)
			}
			rep, err := a2.Reconcile()
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.RolledBack)+len(rep.Revoked)+len(rep.OrphanHandles)+rep.OrphanRules+len(rep.OrphanSessions)+len(rep.EndedSessions) != 0 {
				t.Fatalf("second reconcile repaired %+v", rep)
			}
		})
	}
}

func TestCrashCreateSession(t *testing.T) {
	kerneltest.RequireRoot(t)
	for _, step := range SessionSteps {
		t.Run(string(step), func(t *testing.T) {
			d, cfg := newKernel(t)
			dir := t.TempDir()
			a := openAgent(t, d, dir)
			mustSession(t, a, SessionSpec{ID: "s1"})
			d.Close()
			runCrashChild(t, cfg, dir, string(step), "SHK_OP=session")
			d2, err := dataplane.Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			a2 := openAgent(t, d2, dir, func(c *Config) { c.Events = discardSink{} })
			if ss := a2.Sessions(); len(ss) != 1 || ss[0].ID != "s1" {
				t.Fatalf("sessions after a crash at %s: %+v", step, ss)
			}
			ks, err := d2.Sessions()
			if err != nil {
				t.Fatal(err)
			}
			if len(ks) != 1 || ks[0].Name != "s1" {
				t.Fatalf("kernel sessions after a crash at %s: %+v", step, ks)
			}
			// The half-created session can be created again.
			if err := a2.CreateSession(SessionSpec{ID: "s2", Image: "py"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
