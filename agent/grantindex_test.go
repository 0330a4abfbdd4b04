package agent

// The grants by session (grantindex.go), on the memory backend.

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend/memory"
	"github.com/shinken-agent/shinken/agent/store"
)

// TestGrantPushesOwnSessionsGrants: a grant's resolver policy push (unlock)
// looks at that session's grants only, not at every grant the state keeps
// (other sessions' live grants and tombstones): with 40 grants in other
// sessions, half of them revoked, a grant to a fresh session examines its
// own records, and the resolver still gets the right policy.
func TestGrantPushesOwnSessionsGrants(t *testing.T) {
	m := newMemoryAgent(t)
	f := &fakeDNS{pol: map[string][]string{}}
	m.AttachDNS(f)
	for i := range 4 {
		m.session(t, fmt.Sprintf("o%d", i))
	}
	for i := range 40 {
		g := m.grant(t, GrantRequest{Session: fmt.Sprintf("o%d", i%4), Capability: loopEgress(fmt.Sprintf("127.0.0.%d:443", 2+i))})
		if i%2 == 0 {
			if err := m.Revoke(ctx, g.Handle); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.session(t, "s1")
	before := m.visited()
	m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress("127.0.0.99:443")})
	if n := m.visited() - before; n != 1 {
		t.Fatalf("the grant to s1 examined %d grant records for its resolver policy, want 1 (its own; 40 are other sessions')", n)
	}
	if doms, ok := f.domains("s1"); !ok || len(doms) != 0 {
		t.Fatalf("s1's policy after an address grant: %v %v", doms, ok)
	}
	if gs := m.Grants("s1"); len(gs) != 1 || gs[0].Session != "s1" {
		t.Fatalf("Grants(s1) = %+v", gs)
	}
	if gs := m.Grants("o1"); len(gs) != 10 {
		t.Fatalf("Grants(o1): %d records, want its 10 (5 revoked)", len(gs))
	}
}

func (m *memoryAgent) visited() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dnsVisited
}

// TestGrantIndexFollowsState: the index holds exactly the state's grants,
// by session, through grants, a grant whose intent could not be written
// (it leaves the state), revokes, the sweep of tombstones past their
// retention, and a restart.
func TestGrantIndexFollowsState(t *testing.T) {
	clk := &memClock{t: time.Now()}
	var failIntent atomic.Bool
	b := memory.MustNew(memory.Config{Now: clk.Now})
	m := newMemoryAgentOn(t, b, func(c *Config) {
		c.Now = clk.Now
		c.TombstoneRetention = time.Hour
		c.StoreFault = func(op string) error {
			if op == store.FaultJournalWrite && failIntent.Swap(false) {
				return syscall.ENOSPC
			}
			return nil
		}
	})
	check := func(when string) {
		t.Helper()
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, ix := range []struct {
			name      string
			want, got grantIndex
		}{{"session", newGrantIndex(m.st.Grants), m.bySession}, {"parent", newChildIndex(m.st.Grants), m.children}} {
			if len(ix.want) != len(ix.got) {
				t.Fatalf("%s: the %s index has %d keys, state %d", when, ix.name, len(ix.got), len(ix.want))
			}
			for s, gs := range ix.want {
				if got := slices.Sorted(maps.Keys(ix.got[s])); !slices.Equal(got, slices.Sorted(maps.Keys(gs))) {
					t.Fatalf("%s: %s %s: index %v, state %v", when, ix.name, s, got, slices.Sorted(maps.Keys(gs)))
				}
				for id, g := range gs {
					if ix.got[s][id] != g {
						t.Fatalf("%s: grant %s: the %s index holds another record than the state", when, id, ix.name)
					}
				}
			}
		}
	}
	m.session(t, "s1")
	m.session(t, "s2")
	var handles []string
	for i := range 6 {
		handles = append(handles, m.grant(t, GrantRequest{Session: fmt.Sprintf("s%d", 1+i%2), Capability: loopEgress(fmt.Sprintf("127.0.0.%d:443", 2+i))}).Handle)
	}
	// Attenuations: a child of the first grant in the other session, and
	// a grandchild; revoking the first takes both.
	child, err := m.Attenuate(ctx, handles[0], GrantRequest{Session: "s2", Lifecycle: LifecycleSession, Capability: loopEgress("127.0.0.2:443")})
	if err != nil {
		t.Fatal(err)
	}
	grandchild, err := m.Attenuate(ctx, child.Handle, GrantRequest{Session: "s2", Lifecycle: LifecycleSession, Capability: loopEgress("127.0.0.2:443")})
	if err != nil {
		t.Fatal(err)
	}
	check("after the grants")
	failIntent.Store(true)
	if _, err := m.Grant(ctx, GrantRequest{Session: "s1", Lifecycle: LifecycleSession, Capability: loopEgress("127.0.0.50:443")}); err == nil {
		t.Fatal("a grant whose intent could not be written succeeded")
	}
	check("after a grant whose intent failed")
	for _, h := range handles[:3] {
		if err := m.Revoke(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	check("after the revokes")
	for _, g := range m.Grants("s2") {
		if (g.ID == child.ID || g.ID == grandchild.ID) && g.Phase != PhaseRevoked {
			t.Fatalf("attenuation %s of a revoked grant: %s", g.ID, g.Phase)
		}
	}
	m.reopen(t)
	check("after a restart")
	clk.add(2 * time.Hour)
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	n := len(m.st.Grants)
	m.mu.Unlock()
	if n != 3 {
		t.Fatalf("after the sweep the state keeps %d grants, want the 3 live ones", n)
	}
	check("after the sweep of tombstones")
	if gs := m.Grants("s1"); len(gs) != 1 {
		t.Fatalf("Grants(s1) after the sweep = %d records, want its live one", len(gs))
	}
}

// TestTombstonesPerSession: past Config.TombstonesPerSession a session's
// oldest tombstones are pruned at the next sweep, whatever their age; its
// live grants, and other sessions under the cap, keep theirs. The pruning
// is durable (a restart does not bring them back), the indexes follow, and
// a pruned grant's handle still revokes (idempotent).
func TestTombstonesPerSession(t *testing.T) {
	clk := &memClock{t: time.Now()}
	b := memory.MustNew(memory.Config{Now: clk.Now})
	m := newMemoryAgentOn(t, b, func(c *Config) {
		c.Now = clk.Now
		c.TombstonesPerSession = 3
	})
	m.session(t, "s1")
	m.session(t, "s2")
	var s1 []*Grant
	for i := range 6 {
		g := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress(fmt.Sprintf("127.0.0.%d:443", 2+i))})
		clk.add(time.Second)
		if err := m.Revoke(ctx, g.Handle); err != nil {
			t.Fatal(err)
		}
		s1 = append(s1, g)
	}
	live := m.grant(t, GrantRequest{Session: "s1", Capability: loopEgress("127.0.0.20:443")})
	for i := range 3 {
		g := m.grant(t, GrantRequest{Session: "s2", Capability: loopEgress(fmt.Sprintf("127.0.0.%d:443", 30+i))})
		if err := m.Revoke(ctx, g.Handle); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(s string) []string {
		var out []string
		for _, g := range m.Grants(s) {
			out = append(out, g.ID)
		}
		slices.Sort(out)
		return out
	}
	if n := len(ids("s1")); n != 7 {
		t.Fatalf("before the sweep s1 has %d grant records, want 7", n)
	}
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{live.ID, s1[3].ID, s1[4].ID, s1[5].ID}
	slices.Sort(want)
	if got := ids("s1"); !slices.Equal(got, want) {
		t.Fatalf("after the sweep s1 keeps %v, want its live grant and its 3 newest tombstones %v", got, want)
	}
	if n := len(ids("s2")); n != 3 {
		t.Fatalf("s2, at the cap, keeps %d tombstones, want 3", n)
	}
	m.reopen(t)
	if got := ids("s1"); !slices.Equal(got, want) {
		t.Fatalf("after a restart s1 has %v, want %v", got, want)
	}
	m.mu.Lock()
	ok := len(m.bySession["s1"]) == 4 && len(m.due.grants) == 6
	m.mu.Unlock()
	if !ok {
		t.Fatal("the indexes still hold pruned tombstones")
	}
	if err := m.Revoke(ctx, s1[0].Handle); err != nil {
		t.Fatalf("revoking a pruned grant's handle: %v", err)
	}
}
