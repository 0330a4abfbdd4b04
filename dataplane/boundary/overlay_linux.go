package boundary

// A persistent path as an overlay (issue 19): the host's directory at the
// path is the lower layer (an idmapped read-only clone, its owner shown as
// the session's, as a read grant shows it), the session name's own
// directory under Config.PersistDir the upper layer (what the session
// writes, creates and deletes there: kept across sessions of the name with
// survives_session), with its work directory beside it. The overlay is
// made with the new mount API from detached mounts (fsopen "overlay",
// fsconfig lowerdir+ / upperdir / workdir by descriptor, fsmount) and
// attached like any other mount of the view; a revoke detaches it.
//
// Idmapped layers and the overlay's own credentials: overlayfs does its
// internal work (the work directory, copy-up, whiteouts) with the
// credentials of whoever made it, the agent (root). Through an upper layer
// idmapped owner -> session only, root has no id there and every such
// operation fails with EOVERFLOW (the kernel then mounts the overlay
// read-only). So the upper layer's idmapping has a second entry: the
// on-disk id overlayInternalID shown as root. What the session writes is
// stored as the directory's owner (shown as the session's, in any later
// session of the name whatever its uid); the overlay's own objects (the
// work directory, whiteouts) are stored as overlayInternalID, in the
// agent's state directory. Tested as the session's uid on this kernel
// (6.18) by TestPersistence; the probe makes one overlay at start and the
// persistence row says which mechanism holds (the bind of the session
// name's directory, without the host's content, where it fails).

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// overlaySource names the overlays of the view in the mount table.
const overlaySource = "shinken-persist"

// persistWork is the work directory of the overlay whose upper layer is
// upper (beside it, in the same directory: an escaped path never starts
// with a dot).
func persistWork(upper string) string {
	return filepath.Join(filepath.Dir(upper), ".work", filepath.Base(upper))
}

// overlayTree makes the detached overlay of lower (the host's directory)
// and upper (the session name's, made if missing, its work directory
// beside it) for the session identity sess.
func (b *Boundary) overlayTree(lower, upper string, sess uint32) (int, error) {
	work := persistWork(upper)
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return -1, err
		}
	}
	base := filepath.Dir(upper)
	lfd, err := b.idmappedTree(lower, sess, true)
	if err != nil {
		return -1, fmt.Errorf("lower layer: %w", err)
	}
	defer unix.Close(lfd)
	var st unix.Stat_t
	if err := unix.Stat(base, &st); err != nil {
		return -1, err
	}
	ns, err := b.overlayNS(st.Uid, st.Gid, sess)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ns)
	ufd, err := cloneTree(base)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ufd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(ns)}
	if err := unix.MountSetattr(ufd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return -1, fmt.Errorf("upper layer: idmap: %w", err)
	}
	var layers [2]int
	for i, rel := range []string{filepath.Base(upper), filepath.Join(".work", filepath.Base(upper))} {
		if layers[i], err = unix.Openat(ufd, rel, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			for _, fd := range layers[:i] {
				unix.Close(fd)
			}
			return -1, fmt.Errorf("upper layer %s: %w", rel, err)
		}
	}
	defer unix.Close(layers[0])
	defer unix.Close(layers[1])
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", overlaySource); err != nil {
		return -1, fmt.Errorf("overlay source: %w", err)
	}
	for _, l := range []struct {
		key string
		fd  int
	}{{"lowerdir+", lfd}, {"upperdir", layers[0]}, {"workdir", layers[1]}} {
		if err := unix.FsconfigSetFd(fs, l.key, l.fd); err != nil {
			return -1, fmt.Errorf("overlay %s (by descriptor): %w", l.key, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("overlay: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount overlay: %w", err)
	}
	// The kernel mounts an overlay read-only when its upper layer cannot
	// be used (it logs why): refuse that rather than show a read-only
	// persistent path.
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(m, &sfs); err != nil || sfs.Flags&unix.ST_RDONLY != 0 {
		unix.Close(m)
		return -1, fmt.Errorf("overlay of %s: mounted read-only by the kernel (its upper layer is unusable: see the kernel log)", lower)
	}
	return m, nil
}

// overlayNS is the user namespace of an upper layer's idmapping: owner
// (uid, and group gid) -> sess, overlayInternalID -> root (idmapNS has the
// first mapping only).
func (b *Boundary) overlayNS(owner, group, sess uint32) (int, error) {
	if owner == overlayInternalID || group == overlayInternalID {
		return -1, fmt.Errorf("persist directory owned by the overlay's internal id %d", overlayInternalID)
	}
	cmd := &exec.Cmd{Path: b.cfg.Catatonit, Args: []string{"catatonit", "-P"}, Env: []string{}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(owner), HostID: int(sess), Size: 1}, {ContainerID: overlayInternalID, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(group), HostID: int(sess), Size: 1}, {ContainerID: overlayInternalID, HostID: 0, Size: 1}},
		Pdeathsig:   unix.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("overlay idmap user namespace: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("overlay idmap user namespace: %w", err)
	}
	return ns, nil
}

// probeOverlay makes one overlay in a scratch directory of dir (the
// persist directory) for uid sess and removes it: nil if persistent paths
// can be overlays here.
func (b *Boundary) probeOverlay(dir string, sess uint32) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// A probe an agent did not finish (it died) left its directory.
	if old, err := filepath.Glob(filepath.Join(dir, ".probe-*")); err == nil {
		for _, o := range old {
			_ = os.RemoveAll(o)
		}
	}
	tmp, err := os.MkdirTemp(dir, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	lower := filepath.Join(tmp, "lower")
	if err := os.Mkdir(lower, 0o755); err != nil {
		return err
	}
	fd, err := b.overlayTree(lower, filepath.Join(tmp, "keep", "upper"), sess)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// PersistOverlay says whether persistent paths are overlays here (nil),
// or why they are binds of the session name's directory.
func (b *Boundary) PersistOverlay() error { return b.persistOverlay }
