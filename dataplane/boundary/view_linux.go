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
	if err := CheckWorkspace(w); err != nil {
		return err
	}
	if !b.useNS {
		return fmt.Errorf("%w: a workspace needs the session's mount namespace", backend.ErrLimitsUnsupported)
	}
	b.mu.Lock()
	h, ok := b.holders[name]
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s (no session boundary)", backend.ErrSessionNotFound, name)
	}
	tree, err := b.idmappedTree(w.Dir, h.uid, w.Mode == backend.ModeReadOnly)
	if err != nil {
		return fmt.Errorf("boundary: workspace %s: %w", w.Dir, err)
	}
	defer unix.Close(tree)
	protected := slices.Clone(w.Protected)
	slices.Sort(protected)
	err = b.inMountNS(h, func() error {
		if err := unix.MoveMount(tree, "", unix.AT_FDCWD, w.Dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach %s: %w", w.Dir, err)
		}
		if w.Mode != backend.ModeWorkspaceWrite {
			return nil
		}
		pinned := map[string]bool{}
		for _, p := range protected {
			fi, err := os.Lstat(p)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			if fi.Mode()&os.ModeSymlink != 0 {
				return fmt.Errorf("protected path %s is a symbolic link", p)
			}
			for _, a := range between(w.Dir, p) {
				if !pinned[a] {
					if err := bindSelf(a, false); err != nil {
						return err
					}
					pinned[a] = true
				}
			}
			if err := bindSelf(p, true); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("boundary: session %s: workspace %s: %w", name, w.Dir, err)
	}
	return nil
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

// bindSelf bind-mounts p onto itself in the current mount namespace (read
// only with ro), never following a symbolic link.
func bindSelf(p string, ro bool) error {
	t, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
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
	if err := unix.MoveMount(t, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	return nil
}

// idmappedTree clones the mount tree at dir (recursively, detached) with an
// idmapping that shows dir's owner (uid and gid) as the session's identity
// sess, nosuid and nodev, read-only with ro. Any other owner's files show
// as the overflow id (nobody): the session has only their "other" access.
func (b *Boundary) idmappedTree(dir string, sess uint32, ro bool) (int, error) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return -1, err
	}
	ns, err := b.idmapNS(st.Uid, st.Gid, sess)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ns)
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
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
