package backendtest

import (
	"errors"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The process section (the process class): its entries applied all or
// nothing, reported by Snapshot, released; and, through a ProcessUser,
// what the next exec of a session process gives: any program before the
// session's first process entry, only the listed ones after, nothing once
// every process grant is revoked, and never another session's programs.

// ProcessUser executes programs the way a session process would.
type ProcessUser interface {
	// Programs returns the paths of n distinct programs that exit 0 (a
	// kernel backend: real executables on the host).
	Programs(t *testing.T, n int) []string
	// Exec says whether a process of session could execute the program
	// at path now.
	Exec(session, path string) (bool, error)
}

// WithProcessUser gives the suite its way of executing programs in a
// backend's sessions, and how to open the backend for the process cases.
func WithProcessUser(open func(t *testing.T) backend.Backend, f func(t *testing.T, b backend.Backend) ProcessUser) Option {
	return func(c *config) { c.procOpen, c.procUser = open, f }
}

// virtualPrograms is the ProcessUser of a backend that models exec (its
// own Exec).
type virtualPrograms struct {
	b interface {
		Exec(session, path string) (bool, error)
	}
}

func (v virtualPrograms) Programs(_ *testing.T, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "/conformance/bin/p" + string(rune('a'+i))
	}
	return out
}
func (v virtualPrograms) Exec(session, path string) (bool, error) { return v.b.Exec(session, path) }

// process opens a backend for the process cases; it skips where the
// backend does not enforce the class.
func (s *suite) process(t *testing.T) (backend.Backend, ProcessUser) {
	t.Helper()
	var b backend.Backend
	if s.cfg.procOpen != nil {
		b = s.cfg.procOpen(t)
	} else {
		b = s.backend(t)
	}
	if lvl := b.Probe().Class(backend.ClassProcess); !lvl.Level.Enforceable() {
		t.Skipf("%T does not enforce process here: %s", b, lvl.Reason)
	}
	if s.cfg.procUser != nil {
		return b, s.cfg.procUser(t, b)
	}
	if o, ok := b.(interface {
		Exec(session, path string) (bool, error)
	}); ok {
		return b, virtualPrograms{o}
	}
	t.Skipf("%T executes no programs and Run was given no WithProcessUser", b)
	return nil, nil
}

func procs(h backend.HandleRef, es ...backend.ProcessEntry) backend.Delta {
	for i := range es {
		es[i].Handle = h
	}
	return backend.Delta{Process: es}
}

func testProcessApply(t *testing.T, s *suite) {
	b, u := s.process(t)
	p := u.Programs(t, 1)[0]
	mustSession(t, b, "s1")
	h := mustHandle(t, b, backend.HandleRef{})
	d := procs(h, backend.ProcessEntry{Exec: p}, backend.ProcessEntry{MaxProcesses: 64})
	mustApply(t, b, "s1", d)
	mustApply(t, b, "s1", d) // again: no second copy
	got := snapshot(t, b).Deltas["s1"].Process
	if m := d.Missing(backend.Delta{Process: got}); m != "" || len(got) != 2 {
		t.Fatalf("snapshot process %v (missing %q), want the 2 entries once", got, m)
	}
	for what, bad := range map[string]backend.Delta{
		"a relative path":      procs(h, backend.ProcessEntry{Exec: "bin/sh"}),
		"neither exec nor max": procs(h, backend.ProcessEntry{}),
		"both exec and max":    procs(h, backend.ProcessEntry{Exec: p, MaxProcesses: 2}),
		"an entry twice":       procs(h, backend.ProcessEntry{Exec: p}, backend.ProcessEntry{Exec: p}),
	} {
		if err := b.Apply("s1", bad); !errors.Is(err, backend.ErrInvalidProcessEntry) {
			t.Errorf("%s: %v, want ErrInvalidProcessEntry", what, err)
		}
	}
	wantErr(t, "process entries in an unknown session", b.Apply("nope", procs(h, backend.ProcessEntry{Exec: p})), backend.ErrSessionNotFound)
	if o, err := b.NewOnceHandle(backend.HandleRef{}, never); err == nil {
		wantErr(t, "process entries under an approve-once handle", b.Apply("s1", procs(o, backend.ProcessEntry{Exec: p})), backend.ErrNotSupported)
	}
	if got2 := snapshot(t, b).Deltas["s1"].Process; !slices.Equal(got, got2) {
		t.Errorf("refused applies changed the process entries: %v, was %v", got2, got)
	}
	mustRevoke(t, b, h)
	if err := b.Release("s1", h, d); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, b).Deltas["s1"].Process; len(got) != 0 {
		t.Errorf("released process entries still held: %v", got)
	}
}

func wantExec(t *testing.T, u ProcessUser, session, path string, want bool) {
	t.Helper()
	got, err := u.Exec(session, path)
	if err != nil {
		t.Fatalf("exec %s in %s: %v", path, session, err)
	}
	if got != want {
		t.Errorf("exec %s in %s: %v, want %v", path, session, got, want)
	}
}

func testUseProcess(t *testing.T, s *suite) {
	b, u := s.process(t)
	ps := u.Programs(t, 3)
	a, c, other := ps[0], ps[1], ps[2]
	mustSession(t, b, "s1")
	mustSession(t, b, "s2")
	wantExec(t, u, "s1", other, true) // not gated yet
	h1 := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", procs(h1, backend.ProcessEntry{Exec: a}))
	wantExec(t, u, "s1", a, true)
	wantExec(t, u, "s1", other, false) // off the list
	wantExec(t, u, "s2", other, true)  // another session is not gated by s1's grant
	// A grant while the session runs, and a child handle dying with its
	// parent (the membrane).
	h2 := mustHandle(t, b, backend.HandleRef{})
	ch := mustHandle(t, b, h2)
	mustApply(t, b, "s1", procs(ch, backend.ProcessEntry{Exec: c}))
	wantExec(t, u, "s1", c, true)
	mustRevoke(t, b, h2)
	wantExec(t, u, "s1", c, false)
	wantExec(t, u, "s1", a, true)
	// The last grant's revoke leaves nothing runnable (never open again).
	mustRevoke(t, b, h1)
	wantExec(t, u, "s1", a, false)
	wantExec(t, u, "s1", other, false)
	wantExec(t, u, "s2", a, true)
}
