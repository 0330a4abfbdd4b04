package backendtest

import (
	"slices"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// testSnapshot: one Snapshot holds exactly the sessions, the handles that
// are not free (with state, parent and deadline) and, per session that
// holds any, the Delta applied there, section by section: what reconcile
// compares with the agent's records.
func testSnapshot(t *testing.T, s *suite) {
	b := s.backend(t)
	empty := mustSession(t, b, "empty")
	s1 := mustSession(t, b, "s1")
	s2 := mustSession(t, b, "s2")
	deadline := time.Now().Add(time.Hour)
	root, err := b.NewHandle(backend.HandleRef{}, deadline)
	if err != nil {
		t.Fatal(err)
	}
	child := mustHandle(t, b, root)
	gone := mustHandle(t, b, backend.HandleRef{})
	dead := mustHandle(t, b, backend.HandleRef{})
	want := map[backend.HandleRef]backend.Handle{
		root:  {Ref: root, State: backend.HandleLive, Expires: deadline},
		child: {Ref: child, State: backend.HandleLive, Parent: root},
		dead:  {Ref: dead, State: backend.HandleRevoked},
	}
	if once, err := b.NewOnceHandle(root, never); err == nil {
		want[once] = backend.Handle{Ref: once, State: backend.HandleOnce, Parent: root}
	}
	d1 := backend.Delta{
		Egress:  []backend.EgressRule{egress("127.0.0.2", 80, root), egress("10.0.0.0/8", 0, child), egress("2001:db8::/32", 443, child)},
		Inbound: []backend.EgressRule{inbound("192.0.2.0/24", 8080, root)},
	}
	d2 := backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 80, child)}}
	mustApply(t, b, "s1", d1)
	mustApply(t, b, "s2", d2)
	mustRevoke(t, b, gone)
	if err := b.Release("", gone, backend.Delta{}); err != nil {
		t.Fatal(err)
	}
	mustRevoke(t, b, dead)

	snap := snapshot(t, b)
	ss := slices.Clone(snap.Sessions)
	slices.SortFunc(ss, func(x, y backend.Session) int { return int(x.Index) - int(y.Index) })
	wantSessions := []backend.Session{empty, s1, s2}
	slices.SortFunc(wantSessions, func(x, y backend.Session) int { return int(x.Index) - int(y.Index) })
	if !slices.Equal(ss, wantSessions) {
		t.Fatalf("snapshot sessions %v, want %v", ss, wantSessions)
	}
	if len(snap.Handles) != len(want) {
		t.Fatalf("snapshot handles %+v, want %d of them", snap.Handles, len(want))
	}
	for _, h := range snap.Handles {
		w, ok := want[h.Ref]
		if !ok {
			t.Fatalf("snapshot lists handle %+v, not issued or freed", h)
		}
		if h.State != w.State || h.Parent != w.Parent || h.Expires.IsZero() != w.Expires.IsZero() {
			t.Fatalf("snapshot row %+v, want %+v", h, w)
		}
		if d := h.Expires.Sub(w.Expires); d < -time.Second || d > time.Second {
			t.Fatalf("snapshot row %s expires %v, want %v", h.Ref, h.Expires, w.Expires)
		}
	}
	if _, ok := snap.Deltas["empty"]; ok || len(snap.Deltas) != 2 {
		t.Fatalf("snapshot deltas for %d sessions (%v), want s1 and s2 only", len(snap.Deltas), snap.Deltas)
	}
	for name, d := range map[string]backend.Delta{"s1": d1, "s2": d2} {
		if err := sameDelta(snap.Deltas[name], d); err != nil {
			t.Fatalf("snapshot of %s: %v", name, err)
		}
		if m := d.Missing(snap.Deltas[name]); m != "" {
			t.Fatalf("reconcile would find %s missing in %s", m, name)
		}
	}
	// What reconcile does with it: a revoked grant's Delta released, the
	// snapshot follows.
	if err := b.Release("s2", dead, backend.Delta{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := handleIn(snapshot(t, b), dead); ok {
		t.Fatalf("released handle %s still in the snapshot", dead)
	}
}
