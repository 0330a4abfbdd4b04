package backend

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// The files section of a Delta (fs.scope): which paths a grant lets a
// session read or write, and which it denies.

// FileAccess is what a FileEntry gives (or takes) under its path.
type FileAccess string

const (
	FileRead   FileAccess = "read"
	FileWrite  FileAccess = "write"  // never implies read (the grammar's rule; a mount view cannot keep it: see the probe row)
	FileDelete FileAccess = "delete" // unlink and rename away; never implies read or write
	FileDeny   FileAccess = "deny"   // nothing under the path from this entry's handle
	// FilePersist (persistence, survives_session): the path is the
	// session name's own directory, kept by the backend across sessions
	// of that name; FilePersistSession: the same for this session only.
	// Both give read and write under the path.
	FilePersist        FileAccess = "persist"
	FilePersistSession FileAccess = "persist-session"
	// FileConnect (fs.scope connect[]): the host's UNIX socket at exactly
	// Path is reachable from the session (connect(2)); nothing else under
	// the path. The session's /run is its own (empty) otherwise.
	FileConnect FileAccess = "connect"
)

// MaxFilePath bounds a FileEntry's path (the Linux backend keeps entries
// in a pinned map of fixed-size values).
const MaxFilePath = 480

// ErrInvalidFileEntry is wrapped by every FileEntry shape error.
var ErrInvalidFileEntry = errors.New("backend: invalid file entry")

// FileEntry is one entry of the files section: Access under Path (the path
// and everything below it, by whole components), held by Handle.
type FileEntry struct {
	Path   string     `json:"path"`
	Access FileAccess `json:"access"`
	Handle HandleRef  `json:"handle"`
	// Override: an admin policy (the operator's policy directory, not the
	// shipped set) permits this entry's use at Path. The agent derives it
	// when the grant is made and again at every policy apply and reload
	// (FileOverrides), as it does a net rule's NeverOK. Where Path lies at
	// or under a credential location that is not the agent's own, the
	// entry opens that location (FileRightsView); elsewhere it changes
	// nothing. A broad entry above a credential location never does: the
	// grant must name the location or a path in it.
	Override bool `json:"override,omitempty"`
}

func (e FileEntry) String() string {
	if e.Override {
		return fmt.Sprintf("%s %s (handle %s, admin override)", e.Access, e.Path, e.Handle)
	}
	return fmt.Sprintf("%s %s (handle %s)", e.Access, e.Path, e.Handle)
}

// Validate checks the shape: an absolute clean path of at most
// MaxFilePath bytes, a known access, a handle.
func (e FileEntry) Validate() error {
	if !filepath.IsAbs(e.Path) || filepath.Clean(e.Path) != e.Path || len(e.Path) > MaxFilePath || strings.ContainsRune(e.Path, 0) {
		return fmt.Errorf("%w: path %q: absolute, clean, at most %d bytes", ErrInvalidFileEntry, e.Path, MaxFilePath)
	}
	switch e.Access {
	case FileRead, FileWrite, FileDelete, FileDeny, FilePersist, FilePersistSession, FileConnect:
	default:
		return fmt.Errorf("%w: %s: access %q", ErrInvalidFileEntry, e.Path, e.Access)
	}
	if e.Handle.IsZero() {
		return fmt.Errorf("%w: %s: no handle", ErrInvalidFileEntry, e.Path)
	}
	return nil
}

// PathUnder reports whether p is dir or lies below it, by whole components.
func PathUnder(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// FileRights is what a set of entries gives at one path.
type FileRights struct {
	Read, Write, Delete bool
	// Denied: some handle's deny covers the path and no handle gives
	// anything there.
	Denied bool
}

// None reports whether the rights give nothing.
func (r FileRights) None() bool { return !r.Read && !r.Write && !r.Delete }

// NarrowestAt reports whether allow gives p against deny, narrowest
// wins: of the paths of allow and deny that cover p, the deepest decides
// (they all lie on p's chain of ancestors, so the longest is the deepest);
// a deny at the very path of an allow wins that tie (the grammar refuses
// it as contradictory). So write /repo, deny /repo/a, write /repo/a/b give
// /repo and /repo/a/b and not the rest of /repo/a.
func NarrowestAt(allow, deny []string, p string) bool {
	best := -1
	for _, a := range allow {
		if len(a) > best && PathUnder(p, a) {
			best = len(a)
		}
	}
	if best < 0 {
		return false
	}
	for _, d := range deny {
		if len(d) >= best && PathUnder(p, d) {
			return false
		}
	}
	return true
}

// FileRightsAt is what entries (those of live handles) give at path: each
// handle's entries decide for that handle, axis by axis narrowest-wins
// (NarrowestAt: read, write and delete each against the handle's denies;
// a persistence entry is read and write), and the handles' rights add up.
// So nesting is narrowest-wins inside one grant (/repo write, /repo/a
// deny, /repo/a/b write make /repo/a/b writable and the rest of /repo/a
// denied) and across grants a grant's deny takes only its own rights.
func FileRightsAt(entries []FileEntry, path string) FileRights {
	type per struct {
		read, write, del, deny []string
	}
	by := map[HandleRef]*per{}
	var order []HandleRef
	for _, e := range entries {
		if !PathUnder(path, e.Path) {
			continue
		}
		h := by[e.Handle]
		if h == nil {
			h = &per{}
			by[e.Handle] = h
			order = append(order, e.Handle)
		}
		switch e.Access {
		case FileRead:
			h.read = append(h.read, e.Path)
		case FileWrite:
			h.write = append(h.write, e.Path)
		case FileDelete:
			h.del = append(h.del, e.Path)
		case FileDeny:
			h.deny = append(h.deny, e.Path)
		case FilePersist, FilePersistSession:
			h.read, h.write = append(h.read, e.Path), append(h.write, e.Path)
		}
	}
	var r FileRights
	for _, ref := range order {
		h := by[ref]
		hr := FileRights{Read: NarrowestAt(h.read, h.deny, path), Write: NarrowestAt(h.write, h.deny, path), Delete: NarrowestAt(h.del, h.deny, path)}
		if hr.None() && len(h.deny) > 0 {
			r.Denied = true
		}
		r.Read = r.Read || hr.Read
		r.Write = r.Write || hr.Write
		r.Delete = r.Delete || hr.Delete
	}
	if !r.None() {
		r.Denied = false
	}
	return r
}

// ConnectAt reports whether entries (those of live handles) reach the host
// socket at exactly path: a connect entry names it and no deny of the same
// handle names that very path (a connect names a socket, nothing below it,
// so only a deny at the same path is as narrow; it wins that tie, which the
// grammar refuses as contradictory). Credential locations are the caller's.
func ConnectAt(entries []FileEntry, path string) bool {
	return slices.ContainsFunc(entries, func(e FileEntry) bool {
		return e.Access == FileConnect && e.Path == path && !slices.ContainsFunc(entries, func(d FileEntry) bool {
			return d.Handle == e.Handle && d.Access == FileDeny && d.Path == path
		})
	})
}

// FileRightsView is what entries (those of live handles) give at path
// with the credential locations never in force: under one of fixed (the
// agent's own state and policy directories and socket, which no policy
// lifts) or under a container runtime's socket (root on the host; Block
// tier) nothing; under another credential location only what the entries
// that name it or a path in it with Override give (a deny of theirs
// narrowest-wins within their handle, as in FileRightsAt); elsewhere what
// FileRightsAt says. Denied is set wherever a credential location takes
// what the entries would give.
func FileRightsView(entries []FileEntry, never, fixed []string, path string) FileRights {
	for _, l := range [][]string{fixed, ContainerRuntimeSockets} {
		for _, n := range l {
			if PathUnder(path, n) {
				return FileRights{Denied: true}
			}
		}
	}
	inner := ""
	for _, n := range never {
		if PathUnder(path, n) && len(n) > len(inner) {
			inner = n
		}
	}
	if inner == "" {
		return FileRightsAt(entries, path)
	}
	r := FileRightsAt(OverridesUnder(entries, inner), path)
	if r.None() {
		r.Denied = true
	}
	return r
}

// OverridesUnder is the entries that may open the credential location n:
// those at or under n with Override, and the deny entries of their
// handles.
func OverridesUnder(entries []FileEntry, n string) []FileEntry {
	var hs []HandleRef
	for _, e := range entries {
		if e.Override && e.Access != FileDeny && e.Access != FileConnect && PathUnder(e.Path, n) {
			hs = append(hs, e.Handle)
		}
	}
	var out []FileEntry
	for _, e := range entries {
		if slices.Contains(hs, e.Handle) && (e.Access == FileDeny || (e.Override && e.Access != FileConnect && PathUnder(e.Path, n))) {
			out = append(out, e)
		}
	}
	return out
}

// sameFileEntry: the same path, access and handle.
func sameFileEntry(a, b FileEntry) bool { return a == b }

// fileEntriesValid checks each entry and that none is named twice.
func fileEntriesValid(es []FileEntry) error {
	for i, e := range es {
		if err := e.Validate(); err != nil {
			return err
		}
		if slices.ContainsFunc(es[:i], func(o FileEntry) bool { return sameFileEntry(o, e) }) {
			return fmt.Errorf("%w: %s: the delta names this entry twice", ErrInvalidFileEntry, e)
		}
	}
	return nil
}

// missingFile names the first entry of want that have lacks ("" if none).
func missingFile(want, have []FileEntry) string {
	for _, e := range want {
		if !slices.ContainsFunc(have, func(k FileEntry) bool { return sameFileEntry(k, e) }) {
			return "files " + e.String()
		}
	}
	return ""
}

// FileOverrides is an optional role: a backend whose file entries carry
// Override changes one held entry's (named by path, access and handle)
// to e.Override, and the session's view with it. The agent calls it when
// the policies in force change (an admin permit added or removed).
// ErrNotSupported where an entry's override cannot change in place.
type FileOverrides interface {
	SetFileOverride(session string, e FileEntry) error
}

// sameEntryButOverride: the same path, access and handle.
func sameEntryButOverride(a, b FileEntry) bool {
	return a.Path == b.Path && a.Access == b.Access && a.Handle == b.Handle
}

// SetOverride returns es with the entry e names (path, access, handle)
// held once, with e.Override: stale are the copies with the other value it
// dropped (a crash between a backend's change and the grant record's, then
// reconcile re-applying the record, can leave both), added whether e was
// not held as it is; ok is false when es holds no copy at all.
func SetOverride(es []FileEntry, e FileEntry) (out, stale []FileEntry, added, ok bool) {
	held := slices.Contains(es, e)
	for _, k := range es {
		if sameEntryButOverride(k, e) && k.Override != e.Override {
			stale = append(stale, k)
		}
	}
	if !held && len(stale) == 0 {
		return es, nil, false, false
	}
	out = slices.DeleteFunc(slices.Clone(es), func(k FileEntry) bool { return slices.Contains(stale, k) })
	if !held {
		out = append(out, e)
	}
	return out, stale, !held, true
}

// ErrDeleteNeedsWrite is wrapped (with ErrNotSupported) by a backend that
// cannot hold delete apart from write (a mount view: a mount is writable
// or not) when a delete entry has no write of its own grant over it.
var ErrDeleteNeedsWrite = errors.New("delete without write over it: this backend cannot give unlink and rename-away without write (a mount is writable or not); it needs a path_unlink/path_rename hook (BPF LSM)")

// CheckDeleteCovered refuses, for a backend whose write gives delete and
// that cannot give delete alone, every delete entry of es where the same
// handle's writes give no write (narrowest wins, NarrowestAt: a write above
// with the grant's deny between does not count), so that no delete entry
// is ever widened into write. A delete inside its grant's write root adds nothing there:
// say so in the probe row.
func CheckDeleteCovered(es []FileEntry) error {
	for _, e := range es {
		if e.Access != FileDelete {
			continue
		}
		var writes, denies []string
		for _, w := range es {
			if w.Handle == e.Handle && w.Access == FileWrite {
				writes = append(writes, w.Path)
			}
			if w.Handle == e.Handle && w.Access == FileDeny {
				denies = append(denies, w.Path)
			}
		}
		// Narrowest wins: a write above that a deny of the grant between
		// takes does not cover it (below the delete's path a deeper deny
		// takes both alike, and a deeper delete entry is checked itself).
		if !NarrowestAt(writes, denies, e.Path) {
			return fmt.Errorf("%w: %s: %w", ErrNotSupported, e, ErrDeleteNeedsWrite)
		}
	}
	return nil
}
