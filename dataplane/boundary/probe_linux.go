package boundary

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/prepared"
	"golang.org/x/sys/unix"
)

// probe measures every mechanism on this host; nothing is a constant.
func (b *Boundary) probe() {
	var rows []backend.Strength
	add := func(mech string, ok error, mechanism string) bool {
		s := backend.Strength{Class: backend.Class(mech), Level: backend.FixedAtExec, Mechanism: mechanism}
		if ok != nil {
			s.Level, s.Reason = backend.Unavailable, ok.Error()
		}
		rows = append(rows, s)
		return ok == nil
	}
	c := b.cfg
	last := uint64(c.UIDBase) + uint64(c.UIDCount) - 1
	add(MechUIDRange, uidRangeFree(c.UIDBase, c.UIDCount),
		fmt.Sprintf("uid and gid %d + session index (range %d-%d)", c.UIDBase, c.UIDBase, last))

	add(MechCaps, capsProbe(), "securebits locked, bounding/inheritable/ambient sets emptied, no_new_privs")

	b.useSeccomp = add(MechSeccomp, seccompAvailable(), fmt.Sprintf(
		"seccomp filter, TSYNC, %d BPF instructions: %s refused (EPERM); the mount API (%s) refused (EPERM); "+
			"socket and socketpair only for AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK with NETLINK_ROUTE (any other: EAFNOSUPPORT)",
		b.FilterLen(), strings.Join(refusedSyscalls, ", "), strings.Join(refusedMounts, ", ")))

	switch {
	case c.AllowIOURing:
		add(MechIOURing, errors.New("allowed in sessions by the operator's configuration: its operations pass no seccomp check, so a session can make sockets of any family (IORING_OP_SOCKET)"), "none")
	case b.useSeccomp:
		add(MechIOURing, nil, "refused by the seccomp filter ("+strings.Join(ioURingSyscalls, ", ")+": ENOSYS)")
	default:
		add(MechIOURing, errors.New("seccomp is unavailable, so io_uring cannot be refused"), "none")
	}

	userns := usernsAllowed()
	switch {
	case c.AllowUserNS:
		add(MechUserNS, errors.New("allowed in sessions by the operator's configuration"), "none")
	case b.useSeccomp:
		add(MechUserNS, nil, "refused by the seccomp filter (unshare/clone CLONE_NEWUSER: EPERM; clone3: ENOSYS)"+userns)
	default:
		add(MechUserNS, errors.New("seccomp is unavailable, so new user namespaces cannot be refused"+userns), "none")
	}

	catErr := runProbe(exec.Command(c.Catatonit, "-V"), 0)
	okCat := add(MechCatatonit, catErr, c.Catatonit+" -P as pid 1 of each session's PID namespace")
	pidErr := errors.New("needs " + MechCatatonit)
	mntErr := pidErr
	if okCat {
		pidErr = runProbe(exec.Command(c.Catatonit, "-V"), unix.CLONE_NEWPID)
		mntErr = b.probeInit()
	}
	okPID := add(MechPIDNS, pidErr, "own PID namespace per session (own /proc), IPC namespace; each run gets its own cgroup below the session's")
	okMnt := add(MechMountNS, mntErr, "own mount namespace per session (with its PID, IPC and cgroup namespaces, held by its holder, started at the session's first launch, file get or put, or process grant: none while it was never used, and its view laid out then): host root read-only, private /tmp, /dev/shm, /run of its own (empty: a host UNIX socket only through an fs.scope connect grant), minimal /dev, /sys/fs/bpf, debugfs, tracefs, securityfs masked, cgroup2 showing the session's own subtree (cgroup namespace rooted at the session cgroup); "+b.holderHow)
	b.useNS = okCat && okPID && okMnt
	tmpErr := b.tmpfsErr
	if !okMnt {
		tmpErr = errors.New("needs " + MechMountNS)
	}
	add(MechTmpfsSize, tmpErr, fmt.Sprintf("/tmp and /dev/shm: tmpfs of %d bytes each (size=; writing past it: ENOSPC)", c.TmpfsBytes))
	add(MechNProc, nprocProbe(), fmt.Sprintf("RLIMIT_NPROC %d, set by the launcher before it drops to the session's own uid: the kernel counts that uid's processes and threads on the whole host, i.e. the session's (a fork past it: EAGAIN); no cgroup pids.max", c.MaxProcs))

	abi, lerr := ll.LandlockGetABIVersion()
	switch {
	case lerr != nil:
		lerr = fmt.Errorf("Landlock is not enabled: %w", lerr)
	case abi < 6:
		lerr = fmt.Errorf("Landlock ABI %d has no IPC scopes (needs 6): abstract UNIX sockets and signals not scoped", abi)
	}
	b.landlockABI = abi
	b.useLandlock = add(MechLandlock, lerr, fmt.Sprintf("Landlock ABI %d: abstract UNIX sockets and signals scoped to the process tree of each launch", abi))
	// The baseline needs ABI 2 only (refer), not the scopes of ABI 6.
	var fsErr error
	if _, err := ll.LandlockGetABIVersion(); err != nil {
		fsErr = fmt.Errorf("Landlock is not enabled: %w", err)
	} else if landlockFSRights(abi) == 0 {
		fsErr = fmt.Errorf("Landlock ABI %d cannot handle refer (needs 2): renames and links across directories would all be refused", abi)
	}
	b.useLandlockFS = add(MechLandlockFS, fsErr, fmt.Sprintf("Landlock ABI %d, entered by the launcher at every launch: every filesystem right (read, write, execute, ...) denied beneath the %d credential locations (%s), whatever the mount view shows and whatever a grant says, except where an admin override opens one (an admin policy names it, a grant names it or a path in it): launches after the override get a rule for it, those before keep it denied; the agent's own %d (%s) never; allowed everywhere else, where the mount view and file permissions decide", abi, len(c.FileNever), strings.Join(c.FileNever, ", "), len(c.FileNeverFixed), strings.Join(c.FileNeverFixed, ", ")))

	// Persistent paths: overlays where one can be made here (as the
	// first session uid would have it), else binds of the session name's
	// directory (the persistence row says which; not a boundary row).
	switch {
	case c.PersistDir == "":
		b.persistOverlay = fmt.Errorf("no persist directory")
	case !b.useNS:
		b.persistOverlay = fmt.Errorf("no mount namespace")
	case c.PersistBind:
		b.persistOverlay = fmt.Errorf("the configuration asks for binds (boundary.Config.PersistBind)")
	default:
		b.persistOverlay = b.probeOverlay(c.PersistDir, c.UIDBase+1)
	}

	b.report = rows
	var missing []string
	for _, r := range rows {
		// AllowUserNS and AllowIOURing are the operator's explicit
		// acceptance of their rows.
		accepted := c.accepts(string(r.Class)) || (r.Class == MechUserNS && c.AllowUserNS) || (r.Class == MechIOURing && c.AllowIOURing)
		if r.Level == backend.Unavailable && !accepted {
			missing = append(missing, string(r.Class)+": "+r.Reason)
		}
	}
	if len(missing) > 0 {
		b.ready = fmt.Errorf("boundary: session boundary incomplete on this host (accept the weaker level in the config to run anyway): %s", strings.Join(missing, "; "))
	}
}

// tmpfsSized checks that the /tmp and /dev/shm of the session whose pid 1
// is pid (the probe's holder) are tmpfs mounts of size bytes (rounded up to
// whole pages).
func tmpfsSized(pid int, size uint64) error {
	page := uint64(os.Getpagesize())
	want := (size + page - 1) / page * page
	for _, d := range []string{"/tmp", "/dev/shm"} {
		var st unix.Statfs_t
		if err := unix.Statfs(fmt.Sprintf("/proc/%d/root%s", pid, d), &st); err != nil {
			return fmt.Errorf("statfs the probe session's %s: %w", d, err)
		}
		if got := st.Blocks * uint64(st.Bsize); st.Type != unix.TMPFS_MAGIC || got != want {
			return fmt.Errorf("the probe session's %s: filesystem %#x of %d bytes, not a tmpfs of %d", d, st.Type, got, want)
		}
	}
	return nil
}

// nprocProbe: the kernel has RLIMIT_NPROC, and it holds (the agent is not
// exempt from it for session processes: they never run as root).
func nprocProbe() error {
	var cur unix.Rlimit
	if err := unix.Prlimit(0, unix.RLIMIT_NPROC, nil, &cur); err != nil {
		return fmt.Errorf("prlimit(RLIMIT_NPROC): %w", err)
	}
	return nil
}

// uidRangeFree: no user or group of the host has an id in the range.
func uidRangeFree(base, count uint32) error {
	var clash []string
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		fh, err := os.Open(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) < 3 {
				continue
			}
			id, err := strconv.ParseUint(fields[2], 10, 32)
			if err == nil && id >= uint64(base) && id < uint64(base)+uint64(count) {
				clash = append(clash, fmt.Sprintf("%s %s (%d)", f, fields[0], id))
			}
		}
		fh.Close()
	}
	if len(clash) > 0 {
		return fmt.Errorf("ids in the session range belong to: %s", strings.Join(clash, ", "))
	}
	return nil
}

func capsProbe() error {
	if _, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_GET_NO_NEW_PRIVS): %w", err)
	}
	if _, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, 0, 0, 0); err != nil {
		return fmt.Errorf("no ambient capabilities: %w", err)
	}
	if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_CAPBSET_READ): %w", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("the agent is not root: it cannot switch session processes to their uid")
	}
	return nil
}

// usernsAllowed describes whether the host itself lets unprivileged users
// make user namespaces (what the seccomp rule has to stop).
func usernsAllowed() string {
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return "; the host also disables them (kernel.unprivileged_userns_clone=0)"
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return "; the host also disables them (user.max_user_namespaces=0)"
	}
	return "; the host itself allows unprivileged user namespaces"
}

func runProbe(cmd *exec.Cmd, clone uintptr) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: clone}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// probeInit makes a real holder once (all namespaces, all mounts,
// catatonit) outside any session, then kills it: directly where the kernel
// allows it (directInit), else through the launcher's init mode.
func (b *Boundary) probeInit() error {
	err := procPidns()
	if err == nil {
		h := &holder{}
		if err = b.startHolderDirect(h); err == nil {
			b.directInit = true
			b.tmpfsErr = tmpfsSized(h.pid, b.cfg.TmpfsBytes)
			b.release(h)
			b.holderHow = "holders made by the agent (proc pidns option)"
			return nil
		}
	}
	b.holderHow = fmt.Sprintf("holders made by the launcher's init mode (direct: %v)", err)
	cmd := &exec.Cmd{Path: "/proc/self/fd/4", Args: child.Init{Status: 3, Catatonit: b.cfg.Catatonit, TmpfsBytes: b.cfg.TmpfsBytes}.Args()}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: prepared.NSFlags}
	if err := prepared.StartReporting(cmd, b.exe); err != nil {
		return err
	}
	b.tmpfsErr = tmpfsSized(cmd.Process.Pid, b.cfg.TmpfsBytes)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return nil
}

// findHolder returns the holder of the session whose cgroup is cgroup (pid
// and a verified pidfd, which the caller closes), or pidfd -1 if it has
// none: the process of the cgroup that is pid 1 of a PID namespace exactly
// one level below ours, among procs (the cgroup's cgroup.procs as read).
// Only a process that looks like it is opened and checked (a session may
// hold many processes).
func findHolder(cgroup, procs string) (int, int, error) {
	if procs == "" {
		return 0, -1, nil
	}
	self, err := selfNS()
	if err != nil {
		return 0, -1, err
	}
	for _, f := range strings.Fields(procs) {
		pid, err := strconv.Atoi(f)
		if err != nil || !nsInit(pid, self) {
			continue
		}
		if fd, err := openHolder(cgroup, pid); err == nil {
			return pid, fd, nil
		}
	}
	return 0, -1, nil
}

// openHolder returns a pidfd of pid if pid is the holder of the session
// whose cgroup is cgroup: in that cgroup, and pid 1 of a PID namespace
// exactly one level below ours. The pidfd names one process for good, and
// that process is still alive after the checks, so they were about it
// (its pid cannot have been reused meanwhile).
func openHolder(cgroup string, pid int) (int, error) {
	self, err := selfNS()
	if err != nil {
		return -1, err
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, err
	}
	procs, _ := os.ReadFile(cgroup + "/cgroup.procs")
	if nsInit(pid, self) && slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pid)) && unix.PidfdSendSignal(fd, 0, nil, 0) == nil {
		return fd, nil
	}
	unix.Close(fd)
	return -1, fmt.Errorf("process %d is not the holder of %s: %w", pid, cgroup, unix.ESRCH)
}

// selfNS is this process's NSpid line, read once (it cannot change).
var selfNS = sync.OnceValues(func() ([]string, error) { return nsPIDs("self") })

// nsInit reports whether pid is pid 1 of a PID namespace exactly one level
// below ours (self: our NSpid).
func nsInit(pid int, self []string) bool {
	ns, err := nsPIDs(strconv.Itoa(pid))
	return err == nil && len(ns) == len(self)+1 && ns[len(ns)-1] == "1"
}

func nsPIDs(pid string) ([]string, error) {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
			return strings.Fields(v), nil
		}
	}
	return nil, errors.New("no NSpid in /proc/" + pid + "/status")
}
