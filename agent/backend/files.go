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
}

func (e FileEntry) String() string {
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

// FileRightsAt is what entries (those of live handles) give at path: each
// handle's entries decide for that handle, a deny of the handle covering
// path taking everything that handle gives there (deny wins inside one
// grant, as the grammar says); the handles' rights add up. So nesting
// across grants is narrowest-wins: /repo write with /repo/a deny in one
// grant, /repo/a/b write in another, make /repo/a/b writable and the rest
// of /repo/a denied.
func FileRightsAt(entries []FileEntry, path string) FileRights {
	type per struct{ read, write, del, deny bool }
	by := map[HandleRef]*per{}
	for _, e := range entries {
		if !PathUnder(path, e.Path) {
			continue
		}
		h := by[e.Handle]
		if h == nil {
			h = &per{}
			by[e.Handle] = h
		}
		switch e.Access {
		case FileRead:
			h.read = true
		case FileWrite:
			h.write = true
		case FileDelete:
			h.del = true
		case FileDeny:
			h.deny = true
		case FilePersist, FilePersistSession:
			h.read, h.write = true, true
		}
	}
	var r FileRights
	for _, h := range by {
		if h.deny {
			r.Denied = true
			continue
		}
		r.Read = r.Read || h.read
		r.Write = r.Write || h.write
		r.Delete = r.Delete || h.del
	}
	if !r.None() {
		r.Denied = false
	}
	return r
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
