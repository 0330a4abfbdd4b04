package backend

import (
	"errors"
	"slices"
	"testing"
)

// TestFileRightsView: a credential location opens only to entries that
// name it (or a path in it) with Override; never a fixed one or a
// container runtime's socket; a deny of the overriding grant takes its
// rights there.
func TestFileRightsView(t *testing.T) {
	h1, h2 := HandleRef{Slot: 1, Generation: 1}, HandleRef{Slot: 2, Generation: 1}
	never, fixed := []string{"/home/u/.ssh", "/var/lib/shinken", "/run/docker.sock"}, []string{"/var/lib/shinken"}
	broad := FileEntry{Path: "/home", Access: FileWrite, Handle: h1, Override: true}
	named := FileEntry{Path: "/home/u/.ssh", Access: FileRead, Handle: h2, Override: true}
	for _, c := range []struct {
		name    string
		entries []FileEntry
		path    string
		want    FileRights
	}{
		{"beside the location", []FileEntry{broad}, "/home/u/notes", FileRights{Read: false, Write: true}},
		{"a broad entry with an override", []FileEntry{broad}, "/home/u/.ssh/id", FileRights{Denied: true}},
		{"a named entry without an override", []FileEntry{{Path: "/home/u/.ssh", Access: FileRead, Handle: h2}}, "/home/u/.ssh/id", FileRights{Denied: true}},
		{"a named entry with one: only its own rights", []FileEntry{broad, named}, "/home/u/.ssh/id", FileRights{Read: true}},
		{"its grant's deny", []FileEntry{named, {Path: "/home/u/.ssh/keys", Access: FileDeny, Handle: h2}}, "/home/u/.ssh/keys/id", FileRights{Denied: true}},
		{"a fixed location", []FileEntry{{Path: "/var/lib/shinken", Access: FileRead, Handle: h1, Override: true}}, "/var/lib/shinken/x", FileRights{Denied: true}},
		{"a runtime socket", []FileEntry{{Path: "/run/docker.sock", Access: FileWrite, Handle: h1, Override: true}}, "/run/docker.sock", FileRights{Denied: true}},
	} {
		if got := FileRightsView(c.entries, never, fixed, c.path); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestSetOverride: one copy remains, with the value asked; a stale copy
// with the other value (a crash between a backend's change and the
// record's, then reconcile re-applying the record) goes.
func TestSetOverride(t *testing.T) {
	h := HandleRef{Slot: 1, Generation: 1}
	on := FileEntry{Path: "/a", Access: FileRead, Handle: h, Override: true}
	off := on
	off.Override = false
	other := FileEntry{Path: "/b", Access: FileRead, Handle: h}
	out, stale, added, ok := SetOverride([]FileEntry{other, on, off}, off)
	if !ok || added || !slices.Equal(stale, []FileEntry{on}) || !slices.Equal(out, []FileEntry{other, off}) {
		t.Errorf("both copies, set off: out %v stale %v added %v ok %v", out, stale, added, ok)
	}
	out, stale, added, ok = SetOverride([]FileEntry{other, off}, on)
	if !ok || !added || !slices.Equal(stale, []FileEntry{off}) || !slices.Equal(out, []FileEntry{other, on}) {
		t.Errorf("set on: out %v stale %v added %v ok %v", out, stale, added, ok)
	}
	if _, _, _, ok := SetOverride([]FileEntry{other}, on); ok {
		t.Error("an entry not held: ok")
	}
	if err := CheckDeleteCovered([]FileEntry{{Path: "/a/b", Access: FileDelete, Handle: h}, {Path: "/a", Access: FileWrite, Handle: HandleRef{Slot: 2, Generation: 1}}}); !errors.Is(err, ErrDeleteNeedsWrite) {
		t.Errorf("delete under another grant's write: %v, want ErrDeleteNeedsWrite", err)
	}
	if err := CheckDeleteCovered([]FileEntry{{Path: "/a/b", Access: FileDelete, Handle: h}, {Path: "/a", Access: FileWrite, Handle: h}}); err != nil {
		t.Errorf("delete under its grant's write: %v", err)
	}
}
