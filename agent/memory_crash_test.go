package agent

// The crash tests on the memory backend: an agent dies right after a chosen
// step of GRANT, REVOKE or session creation (its CrashHook panics with a
// sentinel the test recovers, and the agent is abandoned, as a killed
// process leaves it), or its backend dies inside one Apply or Release
// (memory.CrashAfter: some of the entries done); then a new agent opens on
// the same state directory and the same backend, and reconcile must leave
// state and backend in agreement, in the fail-closed direction, with
// nothing revoked come back. The kill -9 versions are crash_linux_test.go.

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// memCrashed is what a crashing agent (or backend) panics with.
type memCrashed struct{ at string }

// memCrashAt says where to crash: at the nth time step is reached, the
// agent dies there (op empty), or the backend dies inside the next call of
// op, after k of its entries.
type memCrashAt struct {
	step Step
	nth  int
	op   memory.Op
	k    int
}

func (c memCrashAt) String() string {
	s := string(c.step)
	if c.nth > 1 {
		s += fmt.Sprintf("#%d", c.nth)
	}
	if c.op != "" {
		s += fmt.Sprintf("+%s%%%d", c.op, c.k)
	}
	return s
}

// crash opens an agent with a CrashHook on m's state directory and backend,
// runs f with it and requires the crash to happen; the crashed agent is
// abandoned (closed only when the test ends).
func (m *memoryAgent) crash(t *testing.T, at memCrashAt, f func(a *Agent) error) {
	t.Helper()
	seen := 0
	c := *m
	c.mods = append(slices.Clip(m.mods), func(cfg *Config) {
		cfg.CrashHook = func(s Step) {
			if s != at.step {
				return
			}
			if seen++; seen < max(at.nth, 1) {
				return
			}
			if at.op != "" {
				m.b.CrashAfter(at.op, at.k, memCrashed{at.String()})
				return
			}
			panic(memCrashed{at.String()})
		}
	})
	a, err := c.open(t)
	if err != nil {
		t.Fatalf("open the agent that crashes: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	crashed := func() (hit bool) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(memCrashed); !ok {
					panic(r)
				}
				hit = true
			}
		}()
		err = f(a)
		return false
	}()
	m.b.ClearFaults()
	if !crashed {
		t.Fatalf("no crash at %s: the call returned %v", at, err)
	}
}

// crashCap is one grant with four rules (two addresses × two ports), so
// a crash can land between rules.
func crashCap(x, y string) Capability {
	ax, ay := netip.MustParseAddrPort(x), netip.MustParseAddrPort(y)
	return Capability{Class: ClassNetEgress, Egress: &EgressScope{
		CIDRs: []netip.Prefix{netip.PrefixFrom(ax.Addr(), 32), netip.PrefixFrom(ay.Addr(), 32)},
		Ports: []PortRange{{Lo: ax.Port(), Hi: ax.Port()}, {Lo: ay.Port(), Hi: ay.Port()}},
	}}
}

// checkAgree: a grant that is not live has no live handle and no rule in
// the backend; a live one has its handle live and wantRules rules in
// session; no other handle is live, no other rule exists. It returns the
// number of live grants of session.
func (m *memoryAgent) checkAgree(t *testing.T, session string, wantRules int) (liveGrants int) {
	t.Helper()
	live := m.liveHandles(t)
	rules := m.rules(t, session)
	isLive := func(ref backend.HandleRef) bool {
		return slices.ContainsFunc(live, func(h backend.Handle) bool { return h.Ref == ref })
	}
	carrying := func(ref backend.HandleRef) int {
		n := 0
		for _, r := range rules {
			if r.Handle == ref {
				n++
			}
		}
		return n
	}
	accounted, liveAll := 0, 0
	for _, g := range m.Grants("") {
		if g.Phase != PhaseLive {
			if !g.Kernel.IsZero() && (isLive(g.Kernel) || carrying(g.Kernel) > 0) {
				t.Errorf("grant %s is %s, but its handle %s is live or carries rules", g.ID[:8], g.Phase, g.Kernel)
			}
			continue
		}
		liveAll++
		if !isLive(g.Kernel) {
			t.Errorf("live grant %s: handle %s not live", g.ID[:8], g.Kernel)
		}
		if g.Session != session {
			continue
		}
		liveGrants++
		if n := carrying(g.Kernel); n != wantRules {
			t.Errorf("live grant %s carries %d rules, want %d", g.ID[:8], n, wantRules)
		}
		accounted += wantRules
	}
	if len(live) != liveAll {
		t.Errorf("%d live handles for %d live grants", len(live), liveAll)
	}
	if len(rules) != accounted {
		t.Errorf("%d rules in %s, %d accounted for by live grants", len(rules), session, accounted)
	}
	return liveGrants
}

// converged: a second reconcile repairs nothing.
func (m *memoryAgent) converged(t *testing.T, at memCrashAt) {
	t.Helper()
	rep, err := m.Reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if memRepaired(rep) != 0 {
		t.Fatalf("after a crash at %s, a second reconcile repaired %+v", at, rep)
	}
}

func TestMemoryCrashGrant(t *testing.T) {
	var cases []memCrashAt
	for _, s := range GrantSteps {
		cases = append(cases, memCrashAt{step: s})
		if s == StepGrantApplying { // four rules: the backend dying inside Apply
			for k := 0; k <= 4; k++ {
				cases = append(cases, memCrashAt{step: s, op: memory.OpApply, k: k})
			}
		}
	}
	const x, y = "127.0.0.2:8080", "127.0.0.3:8081"
	for _, at := range cases {
		t.Run(at.String(), func(t *testing.T) {
			m := newMemoryAgent(t)
			m.session(t, "s1")
			m.crash(t, at, func(a *Agent) error {
				_, err := a.Grant(ctx, GrantRequest{Session: "s1", Capability: crashCap(x, y), Lifecycle: LifecycleSession})
				return err
			})
			m.reopen(t)
			wantLive := at.op == "" && (at.step == StepGrantLive || at.step == StepGrantEmitted)
			n := m.checkAgree(t, "s1", 4)
			if (n == 1) != wantLive || n > 1 {
				t.Fatalf("after a crash at %s: %d live grants, want live=%v", at, n, wantLive)
			}
			if wantLive {
				m.wantAllowed(t, "s1", x, y)
			} else {
				m.wantDenied(t, "s1", x, y)
			}
			m.converged(t, at)
			// The same grant can be made again.
			m.grant(t, GrantRequest{Session: "s1", Capability: crashCap(x, y)})
			m.wantAllowed(t, "s1", x, y)
		})
	}
}

func TestMemoryCrashRevoke(t *testing.T) {
	var cases []memCrashAt
	for _, s := range RevokeSteps {
		cases = append(cases, memCrashAt{step: s})
		switch s {
		case StepRevokePolicy: // the backend dying inside the first Release (the descendant's, one rule)
			cases = append(cases, memCrashAt{step: s, op: memory.OpRelease, k: 0}, memCrashAt{step: s, op: memory.OpRelease, k: 1})
		case StepRevokeReleased: // two grants: the descendant, then the root (four rules)
			cases = append(cases, memCrashAt{step: s, nth: 2})
			for _, k := range []int{1, 2, 4} {
				cases = append(cases, memCrashAt{step: s, op: memory.OpRelease, k: k})
			}
		}
	}
	const x, y = "127.0.0.2:8080", "127.0.0.3:8081"
	for _, at := range cases {
		t.Run(at.String(), func(t *testing.T) {
			m := newMemoryAgent(t)
			m.session(t, "s1")
			m.session(t, "sub")
			g := m.grant(t, GrantRequest{Session: "s1", Capability: crashCap(x, y)})
			// A descendant in another session: the membrane must hold too.
			if _, err := m.Attenuate(ctx, g.Handle, GrantRequest{Session: "sub", Capability: loopEgress(x), Lifecycle: LifecycleSession}); err != nil {
				t.Fatal(err)
			}
			m.wantAllowed(t, "s1", x, y)
			m.wantAllowed(t, "sub", x)
			m.crash(t, at, func(a *Agent) error { return a.Revoke(ctx, g.Handle) })
			m.reopen(t)
			for _, s := range []string{"s1", "sub"} {
				if n := m.checkAgree(t, s, 0); n != 0 {
					t.Fatalf("after a crash at %s: %d live grants in %s", at, n, s)
				}
				m.wantDenied(t, s, x, y)
			}
			for _, gi := range m.Grants("") {
				if gi.Phase != PhaseRevoked {
					t.Errorf("grant %s is %s", gi.ID[:8], gi.Phase)
				}
			}
			if err := m.Revoke(ctx, g.Handle); err != nil {
				t.Fatalf("revoke again after recovery: %v", err)
			}
			m.converged(t, at)
		})
	}
}

func TestMemoryCrashCreateSession(t *testing.T) {
	for _, s := range SessionSteps {
		at := memCrashAt{step: s}
		t.Run(at.String(), func(t *testing.T) {
			m := newMemoryAgent(t)
			m.session(t, "s1")
			m.crash(t, at, func(a *Agent) error { return a.CreateSession(SessionSpec{ID: "s2", Image: "py"}) })
			m.reopen(t)
			if ss := m.Sessions(); len(ss) != 1 || ss[0].ID != "s1" {
				t.Fatalf("sessions after a crash at %s: %+v", at, ss)
			}
			ks, err := m.b.Sessions()
			if err != nil || len(ks) != 1 || ks[0].Name != "s1" {
				t.Fatalf("backend sessions after a crash at %s: %+v (%v)", at, ks, err)
			}
			m.session(t, "s2")
			m.converged(t, at)
		})
	}
	// A backend refusing the create leaves nothing, and a retry succeeds.
	m := newMemoryAgent(t)
	m.b.FailNext(memory.OpCreateSession, 1, fmt.Errorf("no space left on device"))
	if err := m.CreateSession(SessionSpec{ID: "s1", Image: "py"}); err == nil {
		t.Fatal("create with a failing backend succeeded")
	}
	if len(m.Sessions()) != 0 {
		t.Fatalf("a failed create left %+v", m.Sessions())
	}
	m.session(t, "s1")
}
