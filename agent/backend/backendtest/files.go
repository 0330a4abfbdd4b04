package backendtest

import (
	"errors"
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The files section (fs.scope): its entries applied all or nothing,
// reported by Snapshot, released; and, through a FileUser, what the next
// open of a session process gives: the nested write/deny/write case across
// grants, a revoke (and a parent's revoke) failing the next open.

// FileUser opens files the way a session process would.
type FileUser interface {
	// FileTree makes a directory holding the files named (slash paths
	// relative to it, each holding some data) that a session may be
	// granted, and returns its path.
	FileTree(t *testing.T, files ...string) string
	// Open says whether a process of session could open path for op
	// (backend.FileRead or FileWrite) now.
	Open(session, path string, op backend.FileAccess) (bool, error)
}

// WithFileUser gives the suite its way of opening files in a backend's
// sessions, and how to open the backend for the file cases (a kernel
// backend needs its session boundary there).
func WithFileUser(open func(t *testing.T) backend.Backend, f func(t *testing.T, b backend.Backend) FileUser) Option {
	return func(c *config) { c.fileOpen, c.fileUser = open, f }
}

// virtualFiles is the FileUser of a backend that models files (its own
// Open): no tree is needed on disk.
type virtualFiles struct {
	b interface {
		Open(session, path string, op backend.FileAccess) (bool, error)
	}
}

func (v virtualFiles) FileTree(*testing.T, ...string) string { return "/conformance" }
func (v virtualFiles) Open(session, path string, op backend.FileAccess) (bool, error) {
	return v.b.Open(session, path, op)
}

// files opens a backend for the file cases; it skips where the backend
// does not enforce fs.scope.
func (s *suite) files(t *testing.T) (backend.Backend, FileUser) {
	t.Helper()
	var b backend.Backend
	if s.cfg.fileOpen != nil {
		b = s.cfg.fileOpen(t)
	} else {
		b = s.backend(t)
	}
	if lvl := b.Probe().Class(backend.ClassFSScope); !lvl.Level.Enforceable() {
		t.Skipf("%T does not enforce fs.scope here: %s", b, lvl.Reason)
	}
	if s.cfg.fileUser != nil {
		return b, s.cfg.fileUser(t, b)
	}
	if o, ok := b.(interface {
		Open(session, path string, op backend.FileAccess) (bool, error)
	}); ok {
		return b, virtualFiles{o}
	}
	t.Skipf("%T opens no files and Run was given no WithFileUser", b)
	return nil, nil
}

func files(h backend.HandleRef, es ...backend.FileEntry) backend.Delta {
	for i := range es {
		es[i].Handle = h
	}
	return backend.Delta{Files: es}
}

func testFilesApply(t *testing.T, s *suite) {
	b, u := s.files(t)
	root := u.FileTree(t, "repo/f")
	mustSession(t, b, "s1")
	h := mustHandle(t, b, backend.HandleRef{})
	d := files(h, backend.FileEntry{Path: root + "/repo", Access: backend.FileWrite}, backend.FileEntry{Path: root + "/repo/a", Access: backend.FileDeny})
	mustApply(t, b, "s1", d)
	mustApply(t, b, "s1", d) // again: no second copy
	got := snapshot(t, b).Deltas["s1"].Files
	if m := d.Missing(backend.Delta{Files: got}); m != "" || len(got) != 2 {
		t.Fatalf("snapshot files %v (missing %q), want the 2 entries once", got, m)
	}
	for what, bad := range map[string]backend.Delta{
		"a relative path":   files(h, backend.FileEntry{Path: "repo", Access: backend.FileWrite}),
		"an unknown access": files(h, backend.FileEntry{Path: root + "/repo", Access: "exec"}),
		"an entry twice":    files(h, backend.FileEntry{Path: root + "/repo", Access: backend.FileRead}, backend.FileEntry{Path: root + "/repo", Access: backend.FileRead}),
	} {
		if err := b.Apply("s1", bad); !errors.Is(err, backend.ErrInvalidFileEntry) {
			t.Errorf("%s: %v, want ErrInvalidFileEntry", what, err)
		}
	}
	wantErr(t, "files in an unknown session", b.Apply("nope", files(h, backend.FileEntry{Path: root + "/repo", Access: backend.FileRead})), backend.ErrSessionNotFound)
	if o, err := b.NewOnceHandle(backend.HandleRef{}, never); err == nil {
		wantErr(t, "files under an approve-once handle", b.Apply("s1", files(o, backend.FileEntry{Path: root + "/repo", Access: backend.FileRead})), backend.ErrNotSupported)
	}
	if got2 := snapshot(t, b).Deltas["s1"].Files; !slices.Equal(got, got2) {
		t.Errorf("refused applies changed the files: %v, was %v", got2, got)
	}
	// delete[] is its own bit: a backend that cannot give delete apart
	// from write refuses a delete entry without its grant's write over it
	// (ErrDeleteNeedsWrite) and changes nothing; one that can holds it.
	hd := mustHandle(t, b, backend.HandleRef{})
	del := files(hd, backend.FileEntry{Path: root + "/repo", Access: backend.FileDelete})
	switch err := b.Apply("s1", del); {
	case err == nil:
		if m := del.Missing(snapshot(t, b).Deltas["s1"]); m != "" {
			t.Errorf("a delete entry applied but not held: %s", m)
		}
		mustRevoke(t, b, hd)
		if err := b.Release("s1", hd, del); err != nil {
			t.Fatal(err)
		}
	case errors.Is(err, backend.ErrDeleteNeedsWrite) && errors.Is(err, backend.ErrNotSupported):
		if got2 := snapshot(t, b).Deltas["s1"].Files; !slices.Equal(got, got2) {
			t.Errorf("a refused delete entry changed the files: %v, was %v", got2, got)
		}
	default:
		t.Errorf("a delete entry alone: %v, want nil or ErrDeleteNeedsWrite", err)
	}
	// Inside its grant's write root every backend holds it.
	hd = mustHandle(t, b, backend.HandleRef{})
	dw := files(hd, backend.FileEntry{Path: root + "/repo", Access: backend.FileWrite}, backend.FileEntry{Path: root + "/repo/f", Access: backend.FileDelete})
	mustApply(t, b, "s1", dw)
	if m := dw.Missing(snapshot(t, b).Deltas["s1"]); m != "" {
		t.Errorf("delete inside its grant's write root: not held: %s", m)
	}
	mustRevoke(t, b, hd)
	if err := b.Release("s1", hd, dw); err != nil {
		t.Fatal(err)
	}
	mustRevoke(t, b, h)
	if err := b.Release("s1", h, d); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, b).Deltas["s1"].Files; len(got) != 0 {
		t.Errorf("released files still held: %v", got)
	}
}

func wantOpen(t *testing.T, u FileUser, session, path string, op backend.FileAccess, want bool) {
	t.Helper()
	got, err := u.Open(session, path, op)
	if err != nil {
		t.Fatalf("open %s for %s: %v", path, op, err)
	}
	if got != want {
		t.Errorf("open %s for %s: %v, want %v", path, op, got, want)
	}
}

func testUseFiles(t *testing.T, s *suite) {
	b, u := s.files(t)
	root := u.FileTree(t, "repo/f", "repo/a/f", "repo/a/b/f", "other/f")
	mustSession(t, b, "s1")
	mustSession(t, b, "s2")
	wantOpen(t, u, "s1", root+"/repo/f", backend.FileWrite, false)
	h1 := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", files(h1, backend.FileEntry{Path: root + "/repo", Access: backend.FileWrite}, backend.FileEntry{Path: root + "/repo/a", Access: backend.FileDeny}))
	h2 := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", files(h2, backend.FileEntry{Path: root + "/repo/a/b", Access: backend.FileWrite}))
	wantOpen(t, u, "s1", root+"/repo/f", backend.FileWrite, true)
	wantOpen(t, u, "s1", root+"/repo/a/f", backend.FileWrite, false)
	wantOpen(t, u, "s1", root+"/repo/a/f", backend.FileRead, false)
	wantOpen(t, u, "s1", root+"/repo/a/b/f", backend.FileWrite, true)
	wantOpen(t, u, "s1", root+"/other/f", backend.FileWrite, false)
	wantOpen(t, u, "s2", root+"/repo/f", backend.FileWrite, false) // another session's grant
	// A revoke that kills no file entry changes no view: s2's grant, and
	// a handle that holds nothing.
	o := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s2", files(o, backend.FileEntry{Path: root + "/other", Access: backend.FileWrite}))
	for _, dead := range []backend.HandleRef{mustHandle(t, b, backend.HandleRef{}), o} {
		reached := dead == o
		if ops := opsDelta(b, func() { mustRevoke(t, b, dead) }); ops.RevokeWrites != 1 || ops.ViewSweeps > 0 && !reached || ops.ViewSweeps > 1 {
			t.Errorf("revoke of %s (entries in s2: %v): %+v, want one write and no view sweep unless it reached an entry", dead, reached, ops)
		}
	}
	wantOpen(t, u, "s2", root+"/other/f", backend.FileWrite, false)
	wantOpen(t, u, "s1", root+"/repo/f", backend.FileWrite, true)
	// A child handle's entry dies with its parent (the membrane).
	c := mustHandle(t, b, h2)
	mustApply(t, b, "s1", files(c, backend.FileEntry{Path: root + "/other", Access: backend.FileWrite}))
	wantOpen(t, u, "s1", root+"/other/f", backend.FileWrite, true)
	mustRevoke(t, b, h2)
	wantOpen(t, u, "s1", root+"/repo/a/b/f", backend.FileWrite, false)
	wantOpen(t, u, "s1", root+"/other/f", backend.FileWrite, false)
	wantOpen(t, u, "s1", root+"/repo/f", backend.FileWrite, true)
	ops := opsDelta(b, func() { mustRevoke(t, b, h1) })
	if ops.RevokeWrites != 1 || ops.Sweeps > 1 || ops.ViewSweeps > 1 {
		t.Errorf("revoke of a file grant: %+v, want one write, at most one sweep and one view sweep", ops)
	}
	wantOpen(t, u, "s1", root+"/repo/f", backend.FileWrite, false)
}
