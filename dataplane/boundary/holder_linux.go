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
//     namespace and clones catatonit from it into new PID, IPC and cgroup
//     namespaces and the session cgroup, while a second thread joined to
//     that mount namespace builds the session's mounts in it (package
//     child's SessionMounts, less /proc) and then the session user's
//     identity; the first then joins catatonit's cgroup namespace and
//     mounts cgroup2 from it (the session's own subtree), then mounts a
//     proc instance of catatonit's PID namespace on /proc (fsopen, pidns=,
//     fsmount, move_mount); both threads end with the call
//     (holderFromThreads). One fork and one exec of catatonit: no Go
//     process starts.
//   - through the launcher binary in init mode (child.Init): the child
//     starts in its new namespaces, mounts everything (/proc from inside
//     its PID namespace, cgroup2 from inside its cgroup namespace) and
//     executes catatonit. One more exec, and a Go
//     start-up (about a millisecond).

// startHolder starts h's catatonit, the pid 1 of the session's namespaces,
// directly in the session cgroup, with the session user's name and home in
// its view (identity_linux.go), before anything runs in the session.
func (b *Boundary) startHolder(h *holder) error {
	cg, err := unix.Open(h.cgroup, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open session cgroup: %w", err)
	}
	defer unix.Close(cg)
	if b.directInit {
		return b.holderFromThreads(h, cg, true)
	}
	if err := b.startHolderInit(h, cg); err != nil {
		return err
	}
	if err := b.inMountNS(h, func() error { return sessionIdentity(h.uid) }); err != nil {
		b.killHolder(h)
		return fmt.Errorf("session init: %w", err)
	}
	return nil
}

// startHolderDirect makes a holder from threads of our own (see above),
// with no session user and no cgroup (the probe).
func (b *Boundary) startHolderDirect(h *holder) error {
	return b.holderFromThreads(h, -1, false)
}

// holderFromThreads makes h's holder directly; cg is the cgroup fd, or -1
// for none; identity lays out the session user's name and home.
//
// Two threads of their own share the work, each ended with it (package
// throwaway). The first unshares the new mount namespace, clones catatonit
// from it and then mounts the views of catatonit's cgroup and PID
// namespaces. The second joins that mount namespace, makes the session's
// mounts (SessionMounts) and then the identity. So catatonit's fork and
// exec (a millisecond or more) overlap the mounts, and the identity
// overlaps the cgroup and proc mounts. Both threads are started first,
// before either has work: a new thread asked for by a thread locked to its
// goroutine comes from the runtime's template thread, half a millisecond
// later here. What orders them: the cgroup and proc mounts wait for
// SessionMounts (it lays out the tree they go on); catatonit runs nothing
// in the file system after its exec, so the mounts may change under it;
// and neither thread opens a file for writing in the new namespace while
// SessionMounts runs (its read-only / would fail with EBUSY), which is why
// catatonit's standard descriptors are /dev/null opened before the
// namespace exists.
func (b *Boundary) holderFromThreads(h *holder, cg int, identity bool) error {
	// Opened in the new namespace, /dev/null would be a file of its copy
	// of /dev, open for writing while SessionMounts makes / read-only.
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("session init: %w", err)
	}
	defer null.Close()
	nsc := make(chan int, 1) // the new mount namespace, or -1 for none
	// The second thread says once on mounted how its SessionMounts went,
	// and on done how the rest went, once it has ended its work.
	mounted, done := make(chan error, 1), make(chan error, 1)
	go func() {
		done <- throwaway.Run(func() error {
			ns := <-nsc
			if ns < 0 {
				mounted <- nil
				return nil
			}
			err := joinMountNS(ns)
			if err == nil {
				err = child.SessionMounts(false, b.cfg.TmpfsBytes)
			}
			mounted <- err
			if err != nil || !identity {
				return nil // said on mounted
			}
			return sessionIdentity(h.uid)
		})
	}()
	return throwaway.Run(func() error {
		ns, err := holderNS()
		nsc <- ns
		if err != nil {
			<-done
			return err
		}
		defer unix.Close(ns)
		return b.holderFromThread(h, cg, null, mounted, done)
	})
}

// holderNS unshares this thread's file system context and mount namespace
// and opens the new namespace.
func holderNS() (int, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return -1, fmt.Errorf("session init: unshare mount namespace: %w", err)
	}
	ns, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("session init: open mount namespace: %w", err)
	}
	return ns, nil
}

// holderFromThread is the first thread's work (see holderFromThreads),
// on that thread, in the new mount namespace, while the second makes the
// session's mounts and says so on mounted, and its end on done.
func (b *Boundary) holderFromThread(h *holder, cg int, null *os.File, mounted, done <-chan error) error {
	kill := func() {
		if h.pid > 0 {
			_ = unix.Kill(h.pid, unix.SIGKILL)
			reap(h)
			h.pid, h.child = 0, false
		}
	}
	fail := func(err error) error {
		<-done
		kill()
		return fmt.Errorf("session init: %w", err)
	}
	cmd := &exec.Cmd{Path: b.cfg.Catatonit, Args: []string{"catatonit", "-P"}, Env: []string{}, Stdin: null, Stdout: null, Stderr: null}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP, Setsid: true}
	if cg >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cg
	}
	// Start returns once catatonit is executing (or with why it could
	// not be); it inherits this thread's mount namespace.
	startErr := cmd.Start()
	if startErr == nil {
		// Our child, reaped by release alone (see holder).
		h.pid, h.child = cmd.Process.Pid, true
		_ = cmd.Process.Release()
	}
	switch mountErr := <-mounted; {
	case mountErr != nil:
		return fail(mountErr)
	case startErr != nil:
		return fail(startErr)
	}
	if err := mountCgroup(h.pid); err != nil {
		return fail(err)
	}
	if err := mountProc(h.pid); err != nil {
		return fail(err)
	}
	if err := <-done; err != nil {
		kill()
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
