package child

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// sessionInit runs as pid 1 of the session's new PID namespace, in its new
// mount, IPC and cgroup namespaces, as root: it builds the session's view of the
// filesystem and executes catatonit -P, which holds the namespaces.
func sessionInit(spec Init) error {
	unix.CloseOnExec(spec.Status)
	// catatonit keeps 0, 1, 2 only: the status pipe, the launcher binary
	// and whatever the agent inherited without close-on-exec close at
	// exec (the holder lives as long as the session).
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close inherited descriptors (close_range): %w", err)
	}
	if !spec.NoMounts {
		if err := SessionMounts(true, spec.TmpfsBytes); err != nil {
			return err
		}
		if err := CgroupMounts("/proc/self/mountinfo", "self"); err != nil {
			return err
		}
	}
	argv := []string{"catatonit", "-P"}
	return fmt.Errorf("exec %s: %w", spec.Catatonit, syscall.Exec(spec.Catatonit, argv, []string{}))
}

// SessionMounts: nothing propagates between the session and the host; the
// host's root (and everything mounted below it) is read-only; a fresh /proc
// shows only the session's processes; /tmp and /dev/shm are private tmpfs
// of tmpfsBytes each (0: the kernel's default size, half the host's memory);
// /run is the session's own, empty (RunMounts, with /sys's SysMasks);
// /dev is a tmpfs with null, zero, full, random, urandom, tty and a private
// devpts instance. It runs in the session's new mount namespace, as root.
// With proc false it leaves /proc alone: a proc mount shows the PID
// namespace of its mounter, so a caller outside the session's mounts /proc
// itself (with the pidns option) once the session's pid 1 exists.
func SessionMounts(proc bool, tmpfsBytes uint64) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / rprivate: %w", err)
	}
	// Mount flags are per mount, and these mounts are this namespace's
	// copies: the host keeps its own writable mounts.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("make / read-only (mount_setattr AT_RECURSIVE): %w", err)
	}
	detach := func(p string) error {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detach %s: %w", p, err)
		}
		return nil
	}
	const common = unix.MS_NOSUID | unix.MS_NODEV
	tmpfs := "mode=1777"
	if tmpfsBytes > 0 {
		tmpfs += ",size=" + strconv.FormatUint(tmpfsBytes, 10)
	}
	steps := []struct {
		detach                    bool
		src, target, fstype, data string
		flags                     uintptr
	}{
		{true, "proc", "/proc", "proc", "", common | unix.MS_NOEXEC},
		{true, "tmpfs", "/dev", "tmpfs", "mode=755,size=64k,nr_inodes=64", unix.MS_NOSUID | unix.MS_NOEXEC},
		{true, "tmpfs", "/tmp", "tmpfs", tmpfs, common},
	}
	if !proc {
		steps = steps[1:]
	}
	for _, s := range steps {
		if s.detach {
			if err := detach(s.target); err != nil {
				return err
			}
		}
		if err := unix.Mount(s.src, s.target, s.fstype, s.flags, s.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", s.fstype, s.target, err)
		}
	}
	if err := RunMounts(); err != nil {
		return err
	}
	nodes := []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
	old := unix.Umask(0)
	defer unix.Umask(old)
	for _, n := range nodes {
		if err := unix.Mknod("/dev/"+n.name, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
		}
	}
	for _, d := range []string{"/dev/pts", "/dev/shm"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := unix.Mount("tmpfs", "/dev/shm", "tmpfs", common, tmpfs); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	for link, target := range map[string]string{
		"/dev/ptmx": "pts/ptmx", "/dev/fd": "/proc/self/fd",
		"/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, link); err != nil {
			return err
		}
	}
	return nil
}
