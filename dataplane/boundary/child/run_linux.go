package child

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// RunSource names the session's own /run in the mount table.
const RunSource = "shinken-run"

// SysMasks are the directories of /sys that tell one session about the
// host's or another session's activity and are of no use to a session:
// BPF pins (the agent's own maps among them), debugfs, tracefs,
// securityfs. Each one the host mounts is covered by an empty read-only
// tmpfs in the session's view.
var SysMasks = []string{"/sys/fs/bpf", "/sys/kernel/debug", "/sys/kernel/tracing", "/sys/kernel/security"}

// RunMounts replaces the host's /run (and /var/run where it is a directory
// of its own, not the usual link to /run) by the session's own: an empty
// tmpfs owned by root, mode 0755, of 256 KiB, so that no host UNIX socket
// in it is reachable (connecting to a pathname socket needs no write to
// its mount, only the socket's own permission); a socket grant puts one
// back at its path (package boundary, ViewSocket). Where /etc/resolv.conf
// is a link into /run (systemd-resolved, resolvconf), that one file is
// kept, read-only. Then the SysMasks the host has are masked. It runs in
// the session's new mount namespace, as root, after the root is made
// read-only.
func RunMounts() error {
	keep, keepFD := "", -1
	if p, err := filepath.EvalSymlinks("/etc/resolv.conf"); err == nil && strings.HasPrefix(p, "/run/") {
		fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("keep %s: %w", p, err)
		}
		keep, keepFD = p, fd
		defer unix.Close(fd)
	}
	// A host without /run (or with /var/run a link) has no host socket
	// there to hide.
	var dirs []string
	if _, err := os.Stat("/run"); err == nil {
		dirs = append(dirs, "/run")
	}
	if fi, err := os.Lstat("/var/run"); err == nil && fi.IsDir() {
		dirs = append(dirs, "/var/run")
	}
	for _, d := range dirs {
		if err := emptyTmpfs(d, RunSource, "mode=755,size=256k,nr_inodes=4096", false); err != nil {
			return err
		}
	}
	if keep != "" {
		if err := os.MkdirAll(filepath.Dir(keep), 0o755); err != nil {
			return fmt.Errorf("keep %s: %w", keep, err)
		}
		if err := os.WriteFile(keep, nil, 0o644); err != nil {
			return fmt.Errorf("keep %s: %w", keep, err)
		}
		if err := unix.MoveMount(keepFD, "", unix.AT_FDCWD, keep, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("keep %s: %w", keep, err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(unix.AT_FDCWD, keep, 0, &attr); err != nil {
			return fmt.Errorf("keep %s read-only: %w", keep, err)
		}
	}
	for _, d := range SysMasks {
		var st unix.Statfs_t
		var parent unix.Statfs_t
		if unix.Statfs(d, &st) != nil || unix.Statfs(filepath.Dir(d), &parent) != nil || st.Type == parent.Type {
			continue // not mounted here: nothing to hide
		}
		if err := emptyTmpfs(d, RunSource, "mode=755,size=4k,nr_inodes=16", true); err != nil {
			return err
		}
	}
	return nil
}

// emptyTmpfs detaches what is mounted at p (with its submounts) and mounts
// an empty tmpfs there, nosuid, nodev, noexec, read-only with ro.
func emptyTmpfs(p, source, data string, ro bool) error {
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detach %s: %w", p, err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(source, p, "tmpfs", flags, data); err != nil {
		return fmt.Errorf("mount the session's own %s: %w", p, err)
	}
	return nil
}
