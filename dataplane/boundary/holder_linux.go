package boundary

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/prepared"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
	"golang.org/x/sys/unix"
)

// The holder is made in one of two ways:
//
//   - directly (directInit, the default where the kernel has procfs's
//     pidns option, Linux 6.15): a thread of the agent unshares a new mount
//     namespace, builds the session's mounts in it (package child's
//     SessionMounts, less /proc), clones catatonit from it into new PID,
//     IPC and cgroup namespaces and the session cgroup, joins that cgroup
//     namespace and mounts cgroup2 from it (the session's own subtree),
//     then mounts a proc instance of catatonit's PID namespace on /proc
//     (fsopen, pidns=, fsmount, move_mount); the thread ends with the call. One fork and one exec of
//     catatonit: no Go process starts.
//   - through the launcher binary in init mode (child.Init): the child
//     starts in its new namespaces, mounts everything (/proc from inside
//     its PID namespace, cgroup2 from inside its cgroup namespace) and
//     executes catatonit. One more exec, and a Go
//     start-up (about a millisecond).

// startHolder starts h's catatonit, the pid 1 of the session's namespaces,
// directly in the session cgroup.
func (b *Boundary) startHolder(h *holder) error {
	cg, err := unix.Open(h.cgroup, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open session cgroup: %w", err)
	}
	defer unix.Close(cg)
	start := b.startHolderInit
	if b.directInit {
		start = b.startHolderDirect
	}
	if err := start(h, cg); err != nil {
		return err
	}
	// The session user's name and home (identity_linux.go), before
	// anything runs in the session.
	if err := b.inMountNS(h, func() error { return sessionIdentity(h.uid) }); err != nil {
		b.killHolder(h)
		return fmt.Errorf("session init: %w", err)
	}
	return nil
}

// startHolderDirect makes the holder from a thread of our own (see above);
// cg is the cgroup fd, or -1 for none (the probe).
func (b *Boundary) startHolderDirect(h *holder, cg int) error {
	// The thread's mount namespace is the session's.
	return throwaway.Run(func() error { return b.holderFromThread(h, cg) })
}

func (b *Boundary) holderFromThread(h *holder, cg int) error {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("session init: unshare mount namespace: %w", err)
	}
	if err := child.SessionMounts(false, b.cfg.TmpfsBytes); err != nil {
		return fmt.Errorf("session init: %w", err)
	}
	cmd := &exec.Cmd{Path: b.cfg.Catatonit, Args: []string{"catatonit", "-P"}, Env: []string{}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP, Setsid: true}
	if cg >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cg
	}
	// Start returns once catatonit is executing (or with why it could
	// not be); it inherits this thread's mount namespace.
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("session init: %w", err)
	}
	// Our child, reaped by release alone (see holder).
	h.pid, h.child = cmd.Process.Pid, true
	_ = cmd.Process.Release()
	if err := mountCgroup(h.pid); err != nil {
		_ = unix.Kill(h.pid, unix.SIGKILL)
		reap(h)
		return fmt.Errorf("session init: %w", err)
	}
	if err := mountProc(h.pid); err != nil {
		_ = unix.Kill(h.pid, unix.SIGKILL)
		reap(h)
		return fmt.Errorf("session init: %w", err)
	}
	return nil
}

// mountCgroup joins pid's cgroup namespace (rooted at the session cgroup,
// where clone put pid) on this thread and mounts the session's view of the
// cgroup2 hierarchy from it (child.CgroupMounts). /proc is still the
// host's here, so it names pid.
func mountCgroup(pid int) error {
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/cgroup", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup namespace: %w", err)
	}
	defer unix.Close(ns)
	if err := unix.Setns(ns, unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("join cgroup namespace: %w", err)
	}
	return child.CgroupMounts("/proc/thread-self/mountinfo", strconv.Itoa(pid))
}

// mountProc replaces /proc of this thread's mount namespace with a proc
// instance of pid's PID namespace (nosuid, nodev, noexec, as SessionMounts
// mounts it from inside). /proc is still the host's here, so it names pid.
func mountProc(pid int) error {
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/pid", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open PID namespace: %w", err)
	}
	defer unix.Close(ns)
	fs, err := procContext(ns)
	if err != nil {
		return err
	}
	defer unix.Close(fs)
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("fsmount proc: %w", err)
	}
	defer unix.Close(mnt)
	if err := unix.Unmount("/proc", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach /proc: %w", err)
	}
	if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, "/proc", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount proc on /proc: %w", err)
	}
	return nil
}

// procContext is a created proc superblock context for the PID namespace
// ns (an nsfs fd).
func procContext(ns int) (int, error) {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen proc: %w", err)
	}
	if err := unix.FsconfigSetFd(fs, "pidns", ns); err != nil {
		unix.Close(fs)
		return -1, fmt.Errorf("proc pidns option (Linux 6.15): %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		unix.Close(fs)
		return -1, fmt.Errorf("create proc instance: %w", err)
	}
	return fs, nil
}

// procPidns says whether this kernel's proc takes the pidns option (what
// startHolderDirect needs).
func procPidns() error {
	ns, err := unix.Open("/proc/self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(ns)
	fs, err := procContext(ns)
	if err == nil {
		unix.Close(fs)
	}
	return err
}

// startHolderInit makes the holder through the launcher's init mode.
func (b *Boundary) startHolderInit(h *holder, cg int) error {
	cmd := &exec.Cmd{Path: "/proc/self/fd/4", Args: child.Init{Status: 3, Catatonit: b.cfg.Catatonit, TmpfsBytes: b.cfg.TmpfsBytes}.Args(), Env: []string{child.StartEnv}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: prepared.NSFlags, UseCgroupFD: true, CgroupFD: cg, Setsid: true}
	if err := prepared.StartReporting(cmd, b.exe); err != nil {
		return fmt.Errorf("session init: %w", err)
	}
	// Our child, reaped by release alone: until then its pid names it
	// (see holder), and kill(pid) cannot reach another process.
	h.pid, h.child = cmd.Process.Pid, true
	_ = cmd.Process.Release()
	// The status pipe also closes when the child dies before its exec
	// (the kernel sets the new comm before it closes close-on-exec fds):
	// make sure it is catatonit that holds the namespaces.
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", h.pid))
	if want := filepath.Base(b.cfg.Catatonit); strings.TrimSpace(string(comm)) != want[:min(len(want), 15)] {
		_ = unix.Kill(h.pid, unix.SIGKILL)
		reap(h)
		return fmt.Errorf("session init died before it executed %s (comm %q)", b.cfg.Catatonit, strings.TrimSpace(string(comm)))
	}
	return nil
}
