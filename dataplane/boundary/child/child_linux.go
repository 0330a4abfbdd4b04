package child

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Main runs the re-executed modes and never returns from them; in any other
// process it returns at once. The launcher binary calls it first thing, and
// so does every binary that may be re-executed itself (package boundary's
// Main).
func Main() {
	if len(os.Args) == 1 && os.Args[0] == MemfdArg0 {
		memfdNoExec()
	}
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[0] {
	case LaunchArg0:
		spec, argv, err := ParseLaunch(os.Args)
		if err != nil {
			return
		}
		runtime.LockOSThread()
		fail(spec.Status, launch(spec, argv))
	case InitArg0:
		spec, err := ParseInit(os.Args)
		if err != nil {
			return
		}
		runtime.LockOSThread()
		fail(spec.Status, sessionInit(spec))
	}
}

// fail reports err on the status pipe and exits; the agent's Launch or
// Create returns it.
func fail(status int, err error) {
	msg := "boundary: exec returned"
	if err != nil {
		msg = err.Error()
		// "WHAT\0ERRNO", as the C launcher reports it: the errno
		// crosses the pipe (prepared.StatusError).
		var errno unix.Errno
		if errors.As(err, &errno) {
			if what, ok := strings.CutSuffix(msg, ": "+errno.Error()); ok {
				msg = what + "\x00" + strconv.Itoa(int(errno))
			}
		}
	}
	_, _ = unix.Write(status, []byte(msg))
	os.Exit(127)
}

// launch turns this process (root, already in the session cgroup and
// namespaces) into a confined session process and executes the target.
// Every step runs on the one locked thread that calls execve, and applies
// to that thread (the filter, with TSYNC, to all of them): execve keeps the
// calling thread's credentials, Landlock domain and no_new_privs, and ends
// every other thread.
func launch(spec Launch, argv []string) error {
	unix.CloseOnExec(spec.Status)
	if spec.ExeFD >= 0 {
		unix.CloseOnExec(spec.ExeFD)
	}
	if spec.Ruleset > 0 {
		// The session's cached ruleset: rules added to it would reach
		// every later launch of the session, so the target never holds
		// it (closed once entered, close-on-exec until then).
		unix.CloseOnExec(spec.Ruleset)
	}
	// The target keeps the descriptors below the launcher's own (ruleset,
	// status pipe, binary: they come last), 0, 1, 2 and what the agent
	// passed; every one from there up closes at exec, whatever the agent
	// inherited without close-on-exec (a directory descriptor would let
	// openat leave the session's mount view). Close-on-exec, not closed:
	// the runtime's own descriptors (epoll) stay usable until execve.
	if err := unix.CloseRange(uint(spec.keepBelow()), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close inherited descriptors (close_range): %w", err)
	}
	if !spec.Privileged {
		// Before setresuid: the kernel then marks the process if the
		// uid already has NProc tasks, and execve fails with EAGAIN.
		if spec.NProc != 0 {
			lim := unix.Rlimit{Cur: spec.NProc, Max: spec.NProc}
			if err := unix.Prlimit(0, unix.RLIMIT_NPROC, &lim, nil); err != nil {
				return fmt.Errorf("RLIMIT_NPROC %d: %w", spec.NProc, err)
			}
		}
		if err := dropPrivileges(spec.UID, spec.GID); err != nil {
			return err
		}
		if spec.Ruleset > 0 {
			if err := landlockEnter(spec.Ruleset); err != nil {
				return err
			}
		} else if spec.FS != 0 {
			if err := landlockFS(spec.FS, spec.Landlock, spec.FSRules); err != nil {
				return err
			}
		} else if spec.Landlock != 0 {
			if err := landlockScope(spec.Landlock); err != nil {
				return err
			}
		}
		if spec.Filter != nil {
			if err := loadFilter(spec.Filter); err != nil {
				return err
			}
		}
	}
	env := os.Environ()
	if spec.DropEnv && len(env) > 0 && env[len(env)-1] == StartEnv {
		env = env[:len(env)-1]
	}
	return fmt.Errorf("exec %s: %w", spec.Path, syscall.Exec(spec.Path, argv, env))
}

// Securebits (linux/securebits.h): root gains nothing by being root or
// by executing setuid-root files, set[re]uid never fixes capabilities up,
// capabilities are never kept across setuid, ambient capabilities can
// never be raised; each bit locked.
const (
	secNoRoot            = 1 << 0
	secNoRootLocked      = 1 << 1
	secNoSetuidFixup     = 1 << 2
	secNoSetuidFixupLock = 1 << 3
	secKeepCapsLocked    = 1 << 5
	secNoAmbientRaise    = 1 << 6
	secNoAmbientRaiseLck = 1 << 7
	secureAll            = secNoRoot | secNoRootLocked | secNoSetuidFixup | secNoSetuidFixupLock |
		secKeepCapsLocked | secNoAmbientRaise | secNoAmbientRaiseLck
)

// dropPrivileges: lock securebits, empty the bounding set, become uid:gid
// with no supplementary groups, empty every capability set, clear ambient
// capabilities and set no_new_privs. Fails closed at any step.
func dropPrivileges(uid, gid uint32) error {
	if uid == 0 {
		return fmt.Errorf("boundary: uid 0 without privileged")
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secureAll, 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	// This thread's credentials only (raw syscalls: Go's syscall.Set*
	// would signal every thread of the runtime to change them all, which
	// costs more than the rest of the launch): this thread executes the
	// target, and execve ends every other thread.
	if err := SetThreadIDs(uid, gid); err != nil {
		return err
	}
	// SECBIT_NO_SETUID_FIXUP kept the capabilities through setresuid:
	// clear them all now (effective, permitted, inheritable).
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		// The session's /proc is mounted by then; fall back to the
		// highest capability this build knows.
		return unix.CAP_LAST_CAP, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("cap_last_cap: %w", err)
	}
	return n, nil
}

// landlockScope makes a Landlock domain that handles no access right but
// the given IPC scopes (ABI 6: abstract UNIX sockets, signals) and enters it
// on this thread, the one that executes the target (a domain is per
// thread; execve keeps this thread's).
func landlockScope(scoped uint64) error {
	attr := struct{ fs, net, scoped uint64 }{0, 0, scoped}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("landlock scope: create ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock scope: restrict self: %w", errno)
	}
	return nil
}

// loadFilter installs the agent's seccomp filter on every thread of the
// process (TSYNC). no_new_privs must already be set.
func loadFilter(raw []byte) error {
	filt := make([]unix.SockFilter, len(raw)/8)
	for i := range filt {
		b := raw[8*i:]
		filt[i] = unix.SockFilter{Code: uint16(b[0]) | uint16(b[1])<<8, Jt: b[2], Jf: b[3],
			K: uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24}
	}
	prog := unix.SockFprog{Len: uint16(len(filt)), Filter: &filt[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return fmt.Errorf("seccomp(SET_MODE_FILTER, TSYNC): %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp TSYNC: thread %d cannot be synchronised", r)
	}
	return nil
}

// SetThreadIDs gives the calling thread alone uid and gid and no
// supplementary group (raw system calls: Go's syscall.Set* would change
// every thread of the runtime).
func SetThreadIDs(uid, gid uint32) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return fmt.Errorf("setresgid %d: %w", gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return fmt.Errorf("setresuid %d: %w", uid, e)
	}
	return nil
}

// MemfdArg0 is argv[0] of the mode that sets vm.memfd_noexec=2 in its own
// PID namespace (the exec gate's: a memfd's mount takes no fanotify mark,
// so a gated session's memfds are made non-executable).
const MemfdArg0 = "shinken-memfd-noexec"

// memfdNoExec writes vm.memfd_noexec=2 (the sysctl is the writer's PID
// namespace's), checks it reads back, and exits.
func memfdNoExec() {
	if err := os.WriteFile("/proc/sys/vm/memfd_noexec", []byte("2\n"), 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if b, err := os.ReadFile("/proc/sys/vm/memfd_noexec"); err != nil || strings.TrimSpace(string(b)) != "2" {
		fmt.Fprintf(os.Stderr, "vm.memfd_noexec reads %q (%v)\n", b, err)
		os.Exit(1)
	}
	os.Exit(0)
}
