package boundary

// The session's view of the host's files beyond the read-only root: its
// workspace (issue 19). A mount is added to a live session by the new mount
// API: the tree is cloned in the host's namespace (open_tree
// OPEN_TREE_CLONE), its attributes set while it is detached (mount_setattr:
// an idmapping that shows the directory owner's files as the session's,
// nosuid, nodev, read-only where asked), then a locked thread of the agent
// that unshared CLONE_FS joins the holder's mount namespace (setns on a
// pidfd; CLONE_FS is what lets a thread of a multi-threaded process do it)
// and attaches it with move_mount. The thread is never unlocked: Go ends it
// with its goroutine.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// CheckWorkspace refuses a workspace the host cannot give: its form, a
// directory that does not exist or is reached through a symbolic link (the
// view would be of another path than the one named), a protected path that
// is a symbolic link (it could not be held read-only), and workspace-write
// on a directory the host mounts read-only.
func CheckWorkspace(w backend.Workspace) error {
	if err := w.Validate(); err != nil {
		return err
	}
	fi, err := os.Lstat(w.Dir)
	if err != nil {
		return fmt.Errorf("%w: workspace: %w", backend.ErrInvalidSession, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: workspace %s is not a directory", backend.ErrInvalidSession, w.Dir)
	}
	if real, err := filepath.EvalSymlinks(w.Dir); err != nil || real != w.Dir {
		return fmt.Errorf("%w: workspace %s is reached through a symbolic link (%s)", backend.ErrInvalidSession, w.Dir, real)
	}
	for _, p := range w.Protected {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%w: workspace protected path %s is a symbolic link: it cannot be held read-only", backend.ErrInvalidSession, p)
		}
	}
	if w.Mode == backend.ModeWorkspaceWrite {
		var st unix.Statfs_t
		if err := unix.Statfs(w.Dir, &st); err != nil {
			return fmt.Errorf("%w: workspace: %w", backend.ErrInvalidSession, err)
		}
		if st.Flags&unix.ST_RDONLY != 0 {
			return fmt.Errorf("%w: workspace %s: the host mounts it read-only", backend.ErrLimitsUnsupported, w.Dir)
		}
	}
	return nil
}

// CheckWorkspace is the package's CheckWorkspace, and refuses a workspace
// in a credential location (Config.FileNever: the view would mask it) or
// in a place each session has its own copy of (CheckShown).
func (b *Boundary) CheckWorkspace(w backend.Workspace) error {
	if err := CheckWorkspace(w); err != nil {
		return err
	}
	if err := b.CheckShown(w.Dir); err != nil {
		return fmt.Errorf("%w: workspace %w", backend.ErrInvalidSession, err)
	}
	for _, n := range b.cfg.FileNever {
		if backend.PathUnder(w.Dir, n) {
			return fmt.Errorf("%w: workspace %s lies in the credential location %s", backend.ErrInvalidSession, w.Dir, n)
		}
	}
	return nil
}

// sessionOwn are the places each session's mount namespace has its own
// copy of (child.SessionMounts): a fresh /tmp, a minimal /dev and the
// /proc of its PID namespace. The host's files there are not in the
// view, and the view cannot show a host path there: the mount point is
// missing in the session's copy (an empty tmpfs), and making it would
// mean writing in directories the session itself may write (its /tmp,
// mode 1777). /run is the session's own too, but a view path there gets
// its mount point made (sockets_linux.go mountPoint: the session cannot
// write its /run).
var sessionOwn = []string{"/tmp", "/dev", "/proc"}

// CheckShown refuses a path the view is asked to show or hide (a
// workspace, a file entry) that lies in one of sessionOwn where sessions
// have their own mount namespace: accepted, it would fail every later
// view change and launch of the session instead.
func (b *Boundary) CheckShown(p string) error {
	if !b.useNS {
		return nil
	}
	for _, d := range sessionOwn {
		if backend.PathUnder(p, d) {
			return fmt.Errorf("%s lies in %s, which each session has its own copy of (the host's %s is not in its view); choose a path outside %s", p, d, d, strings.Join(sessionOwn, ", "))
		}
	}
	return nil
}

// SetWorkspace makes w part of session name's view: the directory at the
// same path, its files (those of its owner, uid and gid) shown as the
// session's (an idmapped mount: what the session creates is stored as the
// owner's), nosuid and nodev, read-only in ModeReadOnly; in
// ModeWorkspaceWrite every existing protected path is held read-only by a
// read-only bind mount over it, and each directory between it and the
// workspace is a bind mount of itself, so that none can be renamed or
// removed (a mount point cannot be, in the namespace that holds the mount)
// to put a writable copy in its place.
func (b *Boundary) SetWorkspace(name string, w backend.Workspace) error {
	if err := b.CheckWorkspace(w); err != nil {
		return err
	}
	return b.updateView(name, func(v *ViewSpec) { v.Workspace = &w })
}

// SeedWorkspace records session name's workspace as part of its view
// spec without changing any mount: the next change (SetFiles) lays out
// the whole view at once. For an agent that adopts a session.
func (b *Boundary) SeedWorkspace(name string, w backend.Workspace) {
	b.mu.Lock()
	defer b.mu.Unlock()
	spec := ViewSpec{}
	if old := b.specs[name]; old != nil {
		spec = *old
	}
	spec.Workspace = &w
	b.specs[name] = &spec
	delete(b.views, name) // read back from the mount table at the next change
	b.rulesets.drop(name, false)
}

// SetFiles makes session name's view give what files (the file entries of
// live handles) give, with every path under never denied wherever a grant
// would open it; the mounts that change are changed, the others stay.
func (b *Boundary) SetFiles(name string, files []backend.FileEntry, never []string) error {
	for _, e := range files {
		if (e.Access == backend.FilePersist || e.Access == backend.FilePersistSession) && b.cfg.PersistDir == "" {
			return fmt.Errorf("%w: %s: no persist directory is configured (Config.PersistDir)", backend.ErrNotSupported, e)
		}
	}
	return b.updateView(name, func(v *ViewSpec) {
		v.Files, v.Never, v.Fixed = files, never, b.cfg.FileNeverFixed
		if b.cfg.PersistDir != "" {
			v.PersistKeep, v.PersistSession = b.persistDirs(name)
			v.PersistMerged = b.persistOverlay == nil
		}
	})
}

// persistDirs are the directories of session name's persistent paths:
// kept across sessions of the name, and for this session only.
func (b *Boundary) persistDirs(name string) (keep, session string) {
	return filepath.Join(b.cfg.PersistDir, "keep", name), filepath.Join(b.cfg.PersistDir, "session", name)
}

// ForgetPersisted removes what sessions named name kept (persistence with
// survives_session); refused while a session of that name exists.
func (b *Boundary) ForgetPersisted(name string) error {
	if err := backend.ValidSessionName(name); err != nil {
		return err
	}
	if b.cfg.PersistDir == "" {
		return fmt.Errorf("%w: no persist directory is configured", backend.ErrNotSupported)
	}
	b.mu.Lock()
	_, live := b.holders[name]
	b.mu.Unlock()
	if live {
		return fmt.Errorf("%w: session %s exists: end it first", backend.ErrSessionExists, name)
	}
	keep, _ := b.persistDirs(name)
	return os.RemoveAll(keep)
}

// MountNS says whether sessions have a mount namespace of their own (a
// view to change).
func (b *Boundary) MountNS() bool { return b.useNS }

// FileNever is the credential locations no session's view opens
// (Config.FileNever). It is the configuration's own list, shared by every
// view spec that holds it, not a copy (a copy per session was 1.8 KiB,
// 180 MiB of a restart at 100,000 sessions): read it, never write its
// elements; its capacity is its length, so an append copies it.
func (b *Boundary) FileNever() []string {
	return b.cfg.FileNever[:len(b.cfg.FileNever):len(b.cfg.FileNever)]
}

// FileNeverFixed is those of FileNever no admin override opens
// (Config.FileNeverFixed).
func (b *Boundary) FileNeverFixed() []string { return slices.Clone(b.cfg.FileNeverFixed) }

// sessionView is what a session's view was made of and how it is laid out.
type sessionView struct {
	spec   ViewSpec
	layout []ViewMount
}

// updateView edits session name's view spec and changes its mounts to the
// new layout (ViewChange). If a mount step fails, the layout is read back
// from the session's mount table at the next change.
func (b *Boundary) updateView(name string, edit func(*ViewSpec)) error {
	if !b.useNS {
		return fmt.Errorf("%w: a session's file view needs its mount namespace", backend.ErrLimitsUnsupported)
	}
	b.viewMu.Lock()
	defer b.viewMu.Unlock()
	b.mu.Lock()
	h, ok := b.holders[name]
	sv := b.views[name]
	var old *ViewSpec
	if ok && !h.started.Load() {
		old = b.specs[name]
	}
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s (no session boundary)", backend.ErrSessionNotFound, name)
	}
	// The session's cached Landlock ruleset names the inodes its paths
	// showed: dropped before the first mount step and after the last
	// (ruleset_linux.go), whatever the change did.
	b.rulesets.drop(name, false)
	defer b.rulesets.drop(name, false)
	if !h.started.Load() {
		// No holder yet (lazy_linux.go; started is set under viewMu, which
		// we hold): the spec alone changes, and the holder's start lays
		// the view out from it.
		spec := ViewSpec{}
		if old != nil {
			spec = *old
		}
		edit(&spec)
		// The mounts the change adds are made here and closed, so that a
		// change the holder's start could not lay out (a path whose
		// mount or idmapping fails) is refused now, as on a running
		// holder, and not at the session's first launch.
		if err := b.checkMounts(h.uid, spec, old); err != nil {
			return fmt.Errorf("boundary: session %s: view: %w", name, err)
		}
		b.mu.Lock()
		b.specs[name] = &spec
		delete(b.views, name)
		b.mu.Unlock()
		return nil
	}
	if sv == nil {
		// Not made by this agent (an adopted holder), or a failed change:
		// read back what the view holds.
		cur, err := readLayout(h.pid)
		if err != nil {
			return fmt.Errorf("boundary: session %s: read its view: %w", name, err)
		}
		sv = &sessionView{layout: cur}
		b.mu.Lock()
		if old := b.specs[name]; old != nil {
			sv.spec = *old
		}
		b.mu.Unlock()
	}
	spec := sv.spec
	edit(&spec)
	return b.layView(name, h, sv, spec)
}

// checkMounts makes (detached, in the host's mount namespace) and closes
// the mounts that spec adds to old's layout for a session of uid: what
// the view change would attach.
func (b *Boundary) checkMounts(uid uint32, spec ViewSpec, old *ViewSpec) error {
	var was []ViewMount
	if old != nil {
		was = old.Layout()
	}
	layout := spec.Layout()
	_, attach := ViewChange(was, layout)
	fds, err := b.prepareMounts(uid, attach, layout)
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	return err
}

// layView changes h's mounts from sv's layout to spec's (b.viewMu held).
func (b *Boundary) layView(name string, h *holder, sv *sessionView, spec ViewSpec) error {
	layout := spec.Layout()
	remove, attach := ViewChange(sv.layout, layout)
	if len(remove)+len(attach) == 0 {
		sv.spec = spec
		b.setView(name, sv)
		return nil
	}
	b.setView(name, nil) // until the change is complete
	fds, err := b.prepareMounts(h.uid, attach, layout)
	defer func() {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	if err == nil {
		err = b.changeMounts(h, remove, attach, fds)
	}
	if err != nil {
		// A view half made could show a write root without the mask
		// inside it: fall back to the host's read-only root, every mount
		// of ours gone (the workspace too); the error says why.
		b.mu.Lock()
		b.specs[name] = &spec
		b.mu.Unlock()
		if rerr := b.resetView(h); rerr != nil {
			err = errors.Join(err, fmt.Errorf("and removing the view's mounts failed: %w", rerr))
		}
		return fmt.Errorf("boundary: session %s: view: %w", name, err)
	}
	// A mount whose path does not exist was not made (prepareMounts:
	// nothing there to show or hide, such as a deny entry's path made
	// later): the layout kept leaves it out, so the session's next view
	// change makes it if the path exists by then (a mask over a path made
	// after its deny, from that change on; the threat model says so).
	made := layout
	done := len(remove)
	for i, m := range attach {
		if m.Pin || fds[i] >= 0 {
			done++
			continue
		}
		made = slices.DeleteFunc(slices.Clone(made), func(k ViewMount) bool { return k == m })
	}
	b.setView(name, &sessionView{spec: spec, layout: made})
	if done == 0 {
		return nil // nothing made or removed
	}
	b.viewChanges.Add(1)
	// A gated session's new mounts get the exec gate's mark before the
	// change returns.
	return b.markExec(name, h)
}

// resetView removes every mount of ours from h's namespace (read-only
// first, deepest first).
func (b *Boundary) resetView(h *holder) error {
	cur, err := readLayout(h.pid)
	if err != nil {
		return err
	}
	slices.Reverse(cur)
	return b.inMountNS(h, func() error {
		var errs []error
		for _, m := range cur {
			attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
			_ = unix.MountSetattr(unix.AT_FDCWD, m.Path, unix.AT_SYMLINK_NOFOLLOW, &attr)
			if err := unix.Unmount(m.Path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("detach %s: %w", m.Path, err))
			}
		}
		return errors.Join(errs...)
	})
}

// changeMounts removes and attaches the mounts of a view change in h's
// namespace (fds: the prepared detached mounts of attach).
func (b *Boundary) changeMounts(h *holder, remove, attach []ViewMount, fds []int) error {
	return b.inMountNS(h, func() error {
		for _, m := range remove {
			if (m.State == ViewWrite || m.State == ViewPersist) && !m.Pin {
				attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
				// EBUSY: a file is open for writing on it, and the kernel
				// makes no mount with writers read-only; it is only
				// detached then (README: what the view cannot take back).
				if err := unix.MountSetattr(unix.AT_FDCWD, m.Path, unix.AT_SYMLINK_NOFOLLOW, &attr); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) {
					return fmt.Errorf("make %s read-only: %w", m.Path, err)
				}
			}
			if err := unix.Unmount(m.Path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("detach %s: %w", m.Path, err)
			}
			if m.State == ViewSocket {
				if err := removeMountPoint(m.Path); err != nil {
					return err
				}
			}
		}
		for i, m := range attach {
			switch {
			case m.Pin:
				if _, err := os.Lstat(m.Path); err != nil {
					continue
				}
				if err := bindSelf(m.Path, false); err != nil {
					return err
				}
			case fds[i] >= 0:
				if err := mountPoint(fds[i], m.Path); err != nil {
					return fmt.Errorf("%s: %w", m.State, err)
				}
				if err := attachAt(fds[i], m.Path); err != nil {
					return fmt.Errorf("%s: %w", m.State, err)
				}
			}
		}
		return nil
	})
}

func (b *Boundary) setView(name string, sv *sessionView) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sv == nil {
		delete(b.views, name)
		return
	}
	b.views[name] = sv
	b.specs[name] = &sv.spec
}

// ViewChanges counts the view changes made since New (mount changes that
// a grant, a revoke or a workspace needed).
func (b *Boundary) ViewChanges() uint64 { return b.viewChanges.Load() }

// prepareMounts makes, in the host's mount namespace, a detached mount for
// each of attach (-1 for a pin, made inside the session's namespace, and
// for a protected or credential path the host does not have): an
// idmapped clone for read and write, a mask for deny (with the mount
// points of the deeper mounts of layout in it), a read-only clone for
// base.
func (b *Boundary) prepareMounts(uid uint32, attach, layout []ViewMount) ([]int, error) {
	fds := make([]int, len(attach))
	for i := range fds {
		fds[i] = -1
	}
	for i, m := range attach {
		if m.Pin {
			continue
		}
		fi, err := os.Lstat(m.Path)
		if errors.Is(err, os.ErrNotExist) {
			continue // nothing there to show or hide (file entries are checked to exist when applied)
		}
		if err != nil {
			return fds, err
		}
		switch m.State {
		case ViewPersist:
			if !fi.IsDir() {
				return fds, fmt.Errorf("persist %s: not a directory", m.Path)
			}
			if b.persistOverlay == nil {
				fds[i], err = b.overlayTree(m.Path, m.Source, uid)
				break
			}
			if err := os.MkdirAll(m.Source, 0o700); err != nil {
				return fds, fmt.Errorf("persist %s: %w", m.Path, err)
			}
			fds[i], err = b.idmappedTree(m.Source, uid, false)
		case ViewRead, ViewWrite:
			fds[i], err = b.idmappedTree(m.Path, uid, m.State == ViewRead)
		case ViewDeny:
			fds[i], err = mask(m.Path, fi.IsDir(), layout)
		case ViewSocket:
			fds[i], err = socketTree(m.Path)
		default:
			fds[i], err = plainTree(m.Path)
		}
		if err != nil {
			return fds, fmt.Errorf("%s %s: %w", m.State, m.Path, err)
		}
	}
	return fds, nil
}
