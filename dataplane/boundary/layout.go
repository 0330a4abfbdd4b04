package boundary

// The layout of a session's view: which mounts, over the host's read-only
// root, realize its workspace, its file grants (fs.scope entries of live
// handles) and the paths no grant opens. Pure functions, tested without
// root (layout_test.go); view_linux.go mounts what they say.

import (
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// ViewState is what a path of the view gives the session.
type ViewState uint8

const (
	ViewBase    ViewState = iota // the host's root as every session sees it: read-only, host ownership
	ViewRead                     // idmapped read-only bind of the host path
	ViewWrite                    // idmapped writable bind of the host path
	ViewDeny                     // masked: an empty read-only tmpfs (a directory) or a node no one can open (a file)
	ViewPersist                  // the session name's own directory (Source), idmapped, writable
	ViewSocket                   // the host's UNIX socket at the path, bound onto the session's own /run (a connect entry)
)

func (s ViewState) String() string {
	return [...]string{"base", "read", "write", "deny", "persist", "socket"}[s]
}

// ViewMount is one mount of the layout: State from Path down, until a
// deeper mount.
type ViewMount struct {
	Path  string
	State ViewState
	// Pin: a mount of the path onto itself that changes nothing but
	// makes the directory a mount point (so that it cannot be renamed or
	// removed): the directories between a workspace and its protected
	// paths.
	Pin bool
	// Source is the directory a ViewPersist mount shows (its files kept
	// by the agent, not the host path's).
	Source string `json:",omitempty"`
}

// ViewSpec is everything a session's view is made of.
type ViewSpec struct {
	Workspace *backend.Workspace
	Files     []backend.FileEntry // entries of live handles only
	Never     []string            // credential locations: denied under any grant without an admin override
	Fixed     []string            // those of Never no override lifts (the agent's own)
	// PersistKeep and PersistSession are the directories holding the
	// session's persistent paths (persistence entries), kept across
	// sessions of its name and for this session only.
	PersistKeep, PersistSession string
	// PersistMerged: a persistent path is an overlay over the host's
	// directory (its content shows): the credential locations under it
	// are masked as under any mount. Otherwise it shows only the session
	// name's own directory.
	PersistMerged bool
}

// PersistSource is the directory under base that holds path p.
func PersistSource(base, p string) string {
	return filepath.Join(base, url.PathEscape(p))
}

// persistAt is the source of the persistent path covering p, if any
// (the innermost).
func (v ViewSpec) persistAt(p string) (string, bool) {
	best := ""
	src := ""
	for _, e := range v.Files {
		if (e.Access != backend.FilePersist && e.Access != backend.FilePersistSession) || !backend.PathUnder(p, e.Path) || len(e.Path) <= len(best) {
			continue
		}
		base := v.PersistKeep
		if e.Access == backend.FilePersistSession {
			base = v.PersistSession
		}
		best, src = e.Path, PersistSource(base, e.Path)
	}
	return src, best != ""
}

// credentialAt is the innermost credential location covering p.
func (v ViewSpec) credentialAt(p string) (string, bool) {
	inner := ""
	for _, n := range v.Never {
		if backend.PathUnder(p, n) && len(n) > len(inner) {
			inner = n
		}
	}
	return inner, inner != ""
}

// stateAt is the state of path p under spec.
func (v ViewSpec) stateAt(p string) ViewState {
	if n, ok := v.credentialAt(p); ok {
		// Only the entries that name the location (or a path in it) with
		// an admin override open it, a location of Fixed never; the
		// workspace does not.
		if backend.FileRightsView(v.Files, v.Never, v.Fixed, p).None() {
			return ViewDeny
		}
		return ViewSpec{Files: backend.OverridesUnder(v.Files, n), PersistKeep: v.PersistKeep, PersistSession: v.PersistSession}.stateAt(p)
	}
	// A socket grant names its socket exactly, deeper than any deny of its
	// grant above it (narrowest wins; backend.ConnectAt).
	if backend.ConnectAt(v.Files, p) {
		return ViewSocket
	}
	if _, ok := v.persistAt(p); ok {
		return ViewPersist
	}
	st := ViewBase
	r := backend.FileRightsAt(v.Files, p)
	switch {
	case r.Write: // a delete entry gives nothing of its own here (the backend refuses one without its grant's write over it)
		st = ViewWrite
	case r.Read:
		st = ViewRead
	case r.Denied:
		st = ViewDeny
	}
	if w := v.Workspace; w != nil && backend.PathUnder(p, w.Dir) {
		ws := ViewRead
		if w.Mode == backend.ModeWorkspaceWrite {
			ws = ViewWrite
		}
		// The workspace adds to what the grants give (a grant's deny
		// inside it takes only that grant's own rights).
		if st == ViewBase || st == ViewDeny || (st == ViewRead && ws == ViewWrite) {
			st = ws
		}
		for _, q := range w.Protected {
			if backend.PathUnder(p, q) && st == ViewWrite {
				st = ViewRead
			}
		}
	}
	return st
}

// Layout is the mounts that realize spec, outermost first (a mount is
// attached after every mount above it). A path gets a mount where its
// state differs from the state of the nearest mount above it; a path
// below no mount is ViewBase. Credential locations matter only under a
// mount that would open them; protected paths of a writable workspace and
// the directories between them and the workspace are mounts whatever
// their state.
//
// Only the credential locations that can matter enter the walk (whose
// cost grows with the square of its paths): one at or above an opened
// path, or at or below one, or below a location above one
// (relevantNever). Any other lies under no mount, and nothing under it
// opens, so it would be skipped anyway (TestLayoutRelevantNever holds
// the two walks equal).
func (v ViewSpec) Layout() []ViewMount {
	return v.layoutOf(true)
}

// layoutOf is Layout, walking every credential location where relevant
// is false.
func (v ViewSpec) layoutOf(relevant bool) []ViewMount {
	var paths []string
	pins := map[string]bool{}
	for _, e := range v.Files {
		paths = append(paths, e.Path)
	}
	if w := v.Workspace; w != nil {
		paths = append(paths, w.Dir)
		if w.Mode == backend.ModeWorkspaceWrite {
			for _, q := range w.Protected {
				paths = append(paths, q)
				pins[q] = true
				for _, a := range between(w.Dir, q) {
					paths = append(paths, a)
					pins[a] = true
				}
			}
		}
	}
	opened := slices.Clone(paths) // the paths a grant or the workspace opens
	never := map[string]bool{}
	nevers := v.Never
	if relevant {
		nevers = relevantNever(v.Never, opened)
	}
	for _, n := range nevers {
		paths = append(paths, n)
		never[n] = true
	}
	slices.SortFunc(paths, comparePaths)
	paths = slices.Compact(paths)
	var out []ViewMount
	above := func(p string) (ViewState, string) {
		for i := len(out) - 1; i >= 0; i-- {
			if backend.PathUnder(p, out[i].Path) {
				return out[i].State, out[i].Source
			}
		}
		return ViewBase, ""
	}
	for _, p := range paths {
		st := v.stateAt(p)
		up, upSrc := above(p)
		if st == ViewPersist {
			if src, _ := v.persistAt(p); src != upSrc {
				out = append(out, ViewMount{Path: p, State: st, Source: src})
			}
			continue
		}
		if never[p] && up == ViewBase && !slices.ContainsFunc(opened, func(o string) bool { return backend.PathUnder(o, p) }) {
			continue // nothing opens it: the host's own permissions hold
		}
		if never[p] && up == ViewPersist && !v.PersistMerged {
			continue // the session's own directory: the host's files are not there
		}
		switch {
		case st != up, never[p] && st != ViewDeny && st != ViewBase:
			// A credential location an override opens is a mount of its
			// own even where the mount above gives the same: the
			// launcher's Landlock rule for it names that mount's root.
			out = append(out, ViewMount{Path: p, State: st})
		case pins[p] && up != ViewBase:
			out = append(out, ViewMount{Path: p, State: st, Pin: true})
		}
	}
	return pinBetween(out)
}

// relevantNever is the credential locations of never that a layout of
// the opened paths must consider: those at or above an opened path, those
// at or below one, and those below a location above one. Any other has no
// mount above it (a mount's path is an opened path or such a location)
// and no opened path below it.
func relevantNever(never, opened []string) []string {
	var above, out []string
	for _, n := range never {
		if slices.ContainsFunc(opened, func(o string) bool { return backend.PathUnder(o, n) }) {
			above = append(above, n)
		}
	}
	for _, n := range never {
		if slices.ContainsFunc(opened, func(o string) bool { return backend.PathUnder(n, o) }) ||
			slices.ContainsFunc(above, func(a string) bool { return backend.PathUnder(n, a) }) {
			out = append(out, n)
		}
	}
	return out
}

// pinBetween adds a pin for every directory between a writable mount and a
// deeper mount of the layout: the session could otherwise rename such a
// directory (it may write there) and carry the deeper mount away from its
// path, out of reach of the next change (a revoke would detach nothing);
// a mount point cannot be renamed.
func pinBetween(out []ViewMount) []ViewMount {
	have := map[string]bool{}
	for _, m := range out {
		have[m.Path] = true
	}
	var add []ViewMount
	for i, m := range out {
		for j := i - 1; j >= 0; j-- {
			a := out[j]
			if !backend.PathUnder(m.Path, a.Path) || a.Path == m.Path {
				continue
			}
			if a.State == ViewWrite || a.State == ViewPersist {
				for _, d := range between(a.Path, m.Path) {
					if !have[d] {
						have[d] = true
						add = append(add, ViewMount{Path: d, State: ViewWrite, Pin: true})
					}
				}
			}
			break // the nearest mount above m
		}
	}
	if len(add) == 0 {
		return out
	}
	out = append(out, add...)
	slices.SortStableFunc(out, func(a, b ViewMount) int { return comparePaths(a.Path, b.Path) })
	return out
}

// comparePaths orders paths outermost first (fewer components), then by
// name.
func comparePaths(a, b string) int {
	if ca, cb := strings.Count(a, "/"), strings.Count(b, "/"); ca != cb {
		return ca - cb
	}
	return strings.Compare(a, b)
}

// ViewChange is what turns a view laid out as old into one laid out as
// new: the mounts of old to remove (deepest first; a writable one is made
// read-only before it goes, so that a process whose working directory or
// open directory is inside it cannot write through it afterwards) and the
// mounts of new to attach (outermost first). A mount of old and new that
// is the same, and that nothing changed above or below it, stays.
func ViewChange(old, new []ViewMount) (remove, attach []ViewMount) {
	key := func(m ViewMount) ViewMount { return m }
	inOld, inNew := map[ViewMount]bool{}, map[ViewMount]bool{}
	for _, m := range old {
		inOld[key(m)] = true
	}
	for _, m := range new {
		inNew[key(m)] = true
	}
	var changed []string
	for _, m := range old {
		if !inNew[m] {
			changed = append(changed, m.Path)
		}
	}
	for _, m := range new {
		if !inOld[m] {
			changed = append(changed, m.Path)
		}
	}
	if len(changed) == 0 {
		return nil, nil
	}
	// dirty: a changed path, every mount below one (it sits on the
	// mount that changes), and every mask above one (its mount points are
	// made with it); until nothing more is added.
	dirty := map[string]bool{}
	for _, p := range changed {
		dirty[p] = true
	}
	all := append(slices.Clone(old), new...)
	for grew := true; grew; {
		grew = false
		for _, m := range all {
			if dirty[m.Path] {
				continue
			}
			for p := range dirty {
				if (backend.PathUnder(m.Path, p) && m.Path != p) || (m.State == ViewDeny && backend.PathUnder(p, m.Path)) {
					dirty[m.Path], grew = true, true
					break
				}
			}
		}
	}
	for _, m := range old {
		if dirty[m.Path] {
			remove = append(remove, m)
		}
	}
	slices.Reverse(remove)
	for _, m := range new {
		if dirty[m.Path] {
			attach = append(attach, m)
		}
	}
	return remove, attach
}

// between lists the directories strictly between dir and p, outermost
// first.
func between(dir, p string) []string {
	var out []string
	for a := filepath.Dir(p); a != dir && strings.HasPrefix(a, dir+"/"); a = filepath.Dir(a) {
		out = append(out, a)
	}
	slices.Reverse(out)
	return out
}
