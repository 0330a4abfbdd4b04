package boundary

// Socket grants in the session's view: the session's /run (and /var/run
// where it is a directory of its own) is an empty tmpfs of its own
// (child.RunMounts); a connect entry (backend.FileConnect) binds the
// host's socket inode onto the same path there, read-only, nosuid, nodev,
// noexec (connect(2) asks for write permission on the socket inode, which
// a read-only mount does not refuse); a revoke detaches it and removes the
// empty file that was its mount point: the next connect gets ENOENT.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// CheckSocket refuses a connect entry the view could not hold: a path that
// does not exist, has a symbolic link on the way, or is not a UNIX socket.
func CheckSocket(p string) error {
	fd, err := openNoSymlinks(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("%s is not a UNIX socket", p)
	}
	return nil
}

// socketTree is a detached read-only bind of the host's socket at p.
func socketTree(p string) (int, error) {
	if err := CheckSocket(p); err != nil {
		return -1, err
	}
	fd, err := openNoSymlinks(p)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	t, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", p, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(t)
		return -1, err
	}
	return t, nil
}

// inSocketDir reports whether p lies below one of backend.SocketDirs.
func inSocketDir(p string) bool {
	for _, d := range backend.SocketDirs {
		if p != d && backend.PathUnder(p, d) {
			return true
		}
	}
	return false
}

// mountPoint makes, in the current (the session's) mount namespace, the
// mount point of the detached mount src at p when p lies in the session's
// own /run and is missing there: its directories (root's, 0755: the
// session cannot write its /run) and p itself, a directory or an empty
// file as src's root is. Elsewhere the host's tree has the path already.
func mountPoint(src int, p string) error {
	if !inSocketDir(p) {
		return nil
	}
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return err
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	dir, err := openNoSymlinks("/")
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	for i, name := range parts {
		last := i == len(parts)-1
		if last && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			fd, err := unix.Openat(dir, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("mount point %s: %w", p, err)
			}
			if err == nil {
				unix.Close(fd)
			}
			return nil
		}
		if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mount point %s: %w", filepath.Join(append([]string{"/"}, parts[:i+1]...)...), err)
		}
		next, err := unix.Openat2(dir, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
		if err != nil {
			return fmt.Errorf("mount point %s: %w", p, err)
		}
		unix.Close(dir)
		dir = next
	}
	return nil
}

// isSocketMount reports whether path, a mount point in the mount namespace
// of pid, lies in a socket directory and is a UNIX socket there (a socket
// grant's bind).
func isSocketMount(pid int, path string) bool {
	if !inSocketDir(path) {
		return false
	}
	fi, err := os.Lstat(fmt.Sprintf("/proc/%d/root%s", pid, path))
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// removeMountPoint removes the empty file a socket's bind was attached
// on, in the session's own /run (the next connect: ENOENT, as before the
// grant); a path that another mount still covers, is gone or is on a
// read-only mount is left.
func removeMountPoint(p string) error {
	if !inSocketDir(p) {
		return nil
	}
	fd, err := openNoSymlinks(filepath.Dir(p))
	if err != nil {
		return nil // gone with its directory
	}
	defer unix.Close(fd)
	// EROFS: a holder made before sessions had their own /run (adopted):
	// the path is the host's, not ours to remove.
	if err := unix.Unlinkat(fd, filepath.Base(p), 0); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EROFS) {
		return fmt.Errorf("remove the mount point %s: %w", p, err)
	}
	return nil
}
