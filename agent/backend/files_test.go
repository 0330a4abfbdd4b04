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
	if err := CheckDeleteCovered([]FileEntry{{Path: "/a/b/c", Access: FileDelete, Handle: h}, {Path: "/a", Access: FileWrite, Handle: h}, {Path: "/a/b", Access: FileDeny, Handle: h}}); !errors.Is(err, ErrDeleteNeedsWrite) {
		t.Errorf("delete under its grant's deny under its write: %v, want ErrDeleteNeedsWrite", err)
	}
	if err := CheckDeleteCovered([]FileEntry{{Path: "/a/b/c/d", Access: FileDelete, Handle: h}, {Path: "/a", Access: FileWrite, Handle: h}, {Path: "/a/b", Access: FileDeny, Handle: h}, {Path: "/a/b/c", Access: FileWrite, Handle: h}}); err != nil {
		t.Errorf("delete under the nested write: %v", err)
	}
}

// TestFileRightsAtNested: narrowest wins inside one handle, axis by axis;
// across handles the rights add up and a deny takes only its own handle's.
func TestFileRightsAtNested(t *testing.T) {
	h1, h2 := HandleRef{Slot: 1, Generation: 1}, HandleRef{Slot: 2, Generation: 1}
	one := []FileEntry{
		{Path: "/repo", Access: FileRead, Handle: h1},
		{Path: "/repo", Access: FileWrite, Handle: h1},
		{Path: "/repo/a", Access: FileDeny, Handle: h1},
		{Path: "/repo/a/b", Access: FileWrite, Handle: h1},
		{Path: "/repo/a/b/c", Access: FileDeny, Handle: h1},
		{Path: "/repo/a/b/c/d", Access: FileRead, Handle: h1},
	}
	for _, c := range []struct {
		entries []FileEntry
		path    string
		want    FileRights
	}{
		{one, "/repo/f", FileRights{Read: true, Write: true}},
		{one, "/repo/a", FileRights{Denied: true}},
		{one, "/repo/a/x", FileRights{Denied: true}},
		{one, "/repo/a/b/x", FileRights{Write: true}}, // no read: write never implies it
		{one, "/repo/a/bx", FileRights{Denied: true}},
		{one, "/repo/a/b/c/x", FileRights{Denied: true}},
		{one, "/repo/a/b/c/d/x", FileRights{Read: true}},
		{one, "/other", FileRights{}},
		{append(slices.Clone(one), FileEntry{Path: "/repo/a", Access: FileRead, Handle: h2}), "/repo/a/x", FileRights{Read: true}},
		{append(slices.Clone(one), FileEntry{Path: "/", Access: FileWrite, Handle: h2}, FileEntry{Path: "/repo/a/b", Access: FileDeny, Handle: h2}), "/repo/a/b/c/x", FileRights{Denied: true}},
		{[]FileEntry{{Path: "/p", Access: FileWrite, Handle: h1}, {Path: "/p", Access: FileDeny, Handle: h1}}, "/p/x", FileRights{Denied: true}}, // the tie: deny
	} {
		if got := FileRightsAt(c.entries, c.path); got != c.want {
			t.Errorf("%v at %s: %+v, want %+v", c.entries, c.path, got, c.want)
		}
	}
	if !ConnectAt([]FileEntry{{Path: "/run/x.sock", Access: FileConnect, Handle: h1}, {Path: "/run", Access: FileDeny, Handle: h1}}, "/run/x.sock") {
		t.Error("a socket under its grant's deny of /run: not reachable")
	}
	if ConnectAt([]FileEntry{{Path: "/run/x.sock", Access: FileConnect, Handle: h1}, {Path: "/run/x.sock", Access: FileDeny, Handle: h1}}, "/run/x.sock") {
		t.Error("a socket its grant also denies: reachable")
	}
}
