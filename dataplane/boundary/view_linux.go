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
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

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
// in a credential location (Config.FileNever: the view would mask it).
func (b *Boundary) CheckWorkspace(w backend.Workspace) error {
	if err := CheckWorkspace(w); err != nil {
		return err
	}
	for _, n := range b.cfg.FileNever {
		if backend.PathUnder(w.Dir, n) {
			return fmt.Errorf("%w: workspace %s lies in the credential location %s", backend.ErrInvalidSession, w.Dir, n)
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

// SetFiles makes session name's view give what files (the file entries of
// live handles) give, with every path under never denied wherever a grant
// would open it; the mounts that change are changed, the others stay.
func (b *Boundary) SetFiles(name string, files []backend.FileEntry, never []string) error {
	return b.updateView(name, func(v *ViewSpec) { v.Files, v.Never = files, never })
}

// MountNS says whether sessions have a mount namespace of their own (a
// view to change).
func (b *Boundary) MountNS() bool { return b.useNS }

// FileNever is the credential locations no session's view opens
// (Config.FileNever).
func (b *Boundary) FileNever() []string { return slices.Clone(b.cfg.FileNever) }

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
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s (no session boundary)", backend.ErrSessionNotFound, name)
	}
	if sv == nil {
		// Not made by this agent (an adopted holder), or a failed change:
		// read back what the view holds.
		cur, err := readLayout(h.pid)
		if err != nil {
			return fmt.Errorf("boundary: session %s: read its view: %w", name, err)
		}
		sv = &sessionView{layout: cur}
		if old := b.specs[name]; old != nil {
			sv.spec = *old
		}
	}
	spec := sv.spec
	edit(&spec)
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
	b.setView(name, &sessionView{spec: spec, layout: layout})
	b.viewChanges.Add(1)
	return nil
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
			if m.State == ViewWrite && !m.Pin {
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
		case ViewRead, ViewWrite:
			fds[i], err = b.idmappedTree(m.Path, uid, m.State == ViewRead)
		case ViewDeny:
			fds[i], err = mask(m.Path, fi.IsDir(), layout)
		default:
			fds[i], err = plainTree(m.Path)
		}
		if err != nil {
			return fds, fmt.Errorf("%s %s: %w", m.State, m.Path, err)
		}
	}
	return fds, nil
}

// maskSource names the masks in the mount table (how readLayout knows
// them).
const maskSource = "shinken-mask"

// mask is a detached read-only mount that hides p: for a directory an
// empty tmpfs holding only the mount points of the layout's deeper mounts,
// for anything else the host's /dev/null mounted nodev, which no one can
// open (EACCES) or connect to.
func mask(p string, dir bool, layout []ViewMount) (int, error) {
	if !dir {
		t, err := unix.OpenTree(unix.AT_FDCWD, "/dev/null", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return -1, fmt.Errorf("clone /dev/null: %w", err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC | unix.MOUNT_ATTR_NOSUID}
		if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			unix.Close(t)
			return -1, err
		}
		return t, nil
	}
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	for k, v := range map[string]string{"source": maskSource, "mode": "0755", "size": "64k", "nr_inodes": "1024"} {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return -1, fmt.Errorf("tmpfs %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("tmpfs: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount tmpfs: %w", err)
	}
	for _, m := range layout {
		if m.Path == p || !backend.PathUnder(m.Path, p) {
			continue
		}
		rel := strings.TrimPrefix(m.Path, p+"/")
		parts := strings.Split(rel, "/")
		for k := 1; k < len(parts); k++ {
			if err := unix.Mkdirat(mnt, strings.Join(parts[:k], "/"), 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(mnt)
				return -1, fmt.Errorf("mask %s: mount point %s: %w", p, rel, err)
			}
		}
		fi, err := os.Lstat(m.Path)
		switch {
		case err != nil:
			continue
		case fi.IsDir():
			err = unix.Mkdirat(mnt, rel, 0o755)
		default:
			var fd int
			if fd, err = unix.Openat(mnt, rel, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); err == nil {
				unix.Close(fd)
			}
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(mnt)
			return -1, fmt.Errorf("mask %s: mount point %s: %w", p, rel, err)
		}
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(mnt, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(mnt)
		return -1, fmt.Errorf("mask read-only: %w", err)
	}
	return mnt, nil
}

// openNoSymlinks opens p as an O_PATH descriptor, refusing a symbolic
// link in any component (RESOLVE_NO_SYMLINKS): a session that may write a
// parent of a path it is granted could otherwise swap a directory for a
// link and have the agent mount, or mask, what the link names.
func openNoSymlinks(p string) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return -1, fmt.Errorf("open %s (no symbolic link on the way): %w", p, err)
	}
	return fd, nil
}

// CheckPath refuses a path the view could not mount: one that does not
// exist or has a symbolic link on the way.
func CheckPath(p string) error {
	fd, err := openNoSymlinks(p)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// cloneTree is a detached recursive clone of the mount tree at p, reached
// through no symbolic link.
func cloneTree(p string) (int, error) {
	fd, err := openNoSymlinks(p)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	t, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", p, err)
	}
	return t, nil
}

// attachAt attaches the detached mount src at p in the current mount
// namespace, p reached through no symbolic link.
func attachAt(src int, p string) error {
	fd, err := openNoSymlinks(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.MoveMount(src, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach at %s: %w", p, err)
	}
	return nil
}

// plainTree is a read-only clone of the host's p, with host ownership.
func plainTree(p string) (int, error) {
	t, err := cloneTree(p)
	if err != nil {
		return -1, err
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(t)
		return -1, err
	}
	return t, nil
}

// readLayout reads back the mounts this package made in the mount
// namespace of pid (a holder): idmapped mounts (read-only: ViewRead, else
// ViewWrite) and masks (ViewDeny), outermost first.
func readLayout(pid int) ([]ViewMount, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []ViewMount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fs := strings.Fields(sc.Text())
		sep := slices.Index(fs, "-")
		if len(fs) < 6 || sep < 0 || sep+2 >= len(fs) {
			continue
		}
		path, opts := unescapeMount(fs[4]), strings.Split(fs[5], ",")
		fstype, source := fs[sep+1], fs[sep+2]
		switch {
		case slices.Contains(opts, "idmapped"):
			st := ViewWrite
			if slices.Contains(opts, "ro") {
				st = ViewRead
			}
			out = append(out, ViewMount{Path: path, State: st})
		case source == maskSource || (fstype == "devtmpfs" && fs[3] == "/null" && path != "/dev/null"):
			out = append(out, ViewMount{Path: path, State: ViewDeny})
		}
	}
	slices.SortStableFunc(out, func(a, b ViewMount) int { return comparePaths(a.Path, b.Path) })
	return out, sc.Err()
}

// bindSelf bind-mounts p onto itself in the current mount namespace (read
// only with ro), never following a symbolic link.
func bindSelf(p string, ro bool) error {
	fd, err := openNoSymlinks(p)
	if err != nil {
		return err
	}
	t, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("clone %s: %w", p, err)
	}
	defer unix.Close(t)
	if ro {
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return attachAt(t, p)
}

// idmappedTree clones the mount tree at dir (recursively, detached) with an
// idmapping that shows dir's owner (uid and gid) as the session's identity
// sess, nosuid and nodev, read-only with ro. Any other owner's files show
// as the overflow id (nobody): the session has only their "other" access.
func (b *Boundary) idmappedTree(dir string, sess uint32, ro bool) (int, error) {
	fd, err := openNoSymlinks(dir)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return -1, err
	}
	ns, err := b.idmapNS(st.Uid, st.Gid, sess)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ns)
	tree, err := cloneTree(dir)
	if err != nil {
		return -1, err
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(ns)}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("idmap (mount_setattr MOUNT_ATTR_IDMAP): %w", err)
	}
	return tree, nil
}

// idmapNS is a user namespace whose one mapping is owner -> sess (uid) and
// group -> sess (gid): the idmapping of a session's view of a directory
// owned by owner:group. The namespace is held by a catatonit started in
// it, which is killed and reaped once its namespace is open.
func (b *Boundary) idmapNS(owner, group, sess uint32) (int, error) {
	cmd := &exec.Cmd{Path: b.cfg.Catatonit, Args: []string{"catatonit", "-P"}, Env: []string{}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(owner), HostID: int(sess), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(group), HostID: int(sess), Size: 1}},
		Pdeathsig:   unix.SIGKILL,
	}
	// Start returns once the maps are written and catatonit executes.
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("idmap user namespace: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("idmap user namespace: %w", err)
	}
	return ns, nil
}

// inMountNS runs fn on a thread of ours in h's mount namespace (and with
// its root and working directory).
func (b *Boundary) inMountNS(h *holder, fn func() error) error {
	pidfd, err := h.open()
	if err != nil {
		return fmt.Errorf("session holder: %w", err)
	}
	defer unix.Close(pidfd)
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread's mount namespace is the session's.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_FS): %w", err)
			return
		}
		if err := unix.Setns(pidfd, unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("join session mount namespace (setns pidfd): %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// HasMountAt says whether session name's view has a mount at dir that
// this package made with an idmapping (how reconcile finds a workspace
// that is already in place, in a holder that outlived an agent).
func (b *Boundary) HasMountAt(name, dir string) (bool, error) {
	b.mu.Lock()
	h, ok := b.holders[name]
	b.mu.Unlock()
	if !ok {
		return false, fmt.Errorf("%w: %s (no session boundary)", backend.ErrSessionNotFound, name)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", h.pid))
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		fs := strings.Fields(sc.Text())
		if len(fs) >= 6 && unescapeMount(fs[4]) == dir && slices.Contains(strings.Split(fs[5], ","), "idmapped") {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				out = append(out, v)
				i += 3
				continue
			}
		}
		out = append(out, s[i])
	}
	return string(out)
}
