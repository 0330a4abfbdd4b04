package boundary

// The mount primitives of the session's view (view_linux.go): paths opened
// with no symbolic link on the way, detached clones (idmapped, read-only),
// masks, attaching in the holder's namespace, reading the view back.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
	"golang.org/x/sys/unix"
)

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
		case source == overlaySource:
			out = append(out, ViewMount{Path: path, State: ViewPersist})
		case source == maskSource || (fstype == "devtmpfs" && fs[3] == "/null" && path != "/dev/null"):
			out = append(out, ViewMount{Path: path, State: ViewDeny})
		case isSocketMount(pid, path):
			out = append(out, ViewMount{Path: path, State: ViewSocket})
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

// inMountNS runs fn on a thread of ours in h's mount namespace (and with
// its root and working directory).
func (b *Boundary) inMountNS(h *holder, fn func() error) error {
	pidfd, err := h.open()
	if err != nil {
		return fmt.Errorf("session holder: %w", err)
	}
	defer unix.Close(pidfd)
	// The thread's mount namespace is the session's.
	return throwaway.Run(func() error {
		if err := joinMountNS(pidfd); err != nil {
			return err
		}
		return fn()
	})
}

// joinMountNS moves this thread (its own file system context first) into
// the mount namespace of ns: a mount namespace's descriptor, or a pidfd of
// a process in it.
func joinMountNS(ns int) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare(CLONE_FS): %w", err)
	}
	if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("join the session's mount namespace (setns): %w", err)
	}
	return nil
}

// HasMountAt says whether session name's view has a mount at dir that
// this package made with an idmapping (how reconcile finds a workspace
// that is already in place, in a holder that outlived an agent).
func (b *Boundary) HasMountAt(name, dir string) (bool, error) {
	h, err := b.holderFor(name, false, false)
	if err != nil {
		return false, err
	}
	if !h.started.Load() {
		return false, nil // no holder yet: no mount (its start lays out the view)
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
