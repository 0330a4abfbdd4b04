package boundary

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// argv[0] of the re-executed modes. Main recognises them only together
// with a well-formed spec in argv[1] and the status pipe at the fd it names.
const (
	launchArg0 = "shinken-session-launch"
	initArg0   = "shinken-session-init"
)

// launchSpec is what the agent tells the launch-mode child.
type launchSpec struct {
	Path        string `json:"path"` // the target, resolved inside the session
	UID         uint32 `json:"uid"`
	GID         uint32 `json:"gid"`
	Privileged  bool   `json:"privileged,omitempty"`
	Status      int    `json:"status"` // fd of the status pipe (write end)
	ExeFD       int    `json:"exe_fd"` // fd of our own binary, closed before exec
	NoSeccomp   bool   `json:"no_seccomp,omitempty"`
	NoLandlock  bool   `json:"no_landlock,omitempty"`
	AllowUserNS bool   `json:"allow_userns,omitempty"`
	Reaper      string `json:"reaper,omitempty"` // run the target as pid 1 of its own PID namespace, under this reaper
}

// initSpec is what the agent tells the session-init child.
type initSpec struct {
	Status    int    `json:"status"`
	Catatonit string `json:"catatonit"`
	NoMounts  bool   `json:"no_mounts,omitempty"`
}

// Main runs the re-executed modes of the package and never returns from
// them; in any other process it returns at once. Call it first thing in
// main (and in TestMain of tests that launch into sessions).
func Main() {
	mainCalled = true
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[0] {
	case launchArg0:
		var spec launchSpec
		if json.Unmarshal([]byte(os.Args[1]), &spec) != nil || spec.Status < 3 {
			return
		}
		runtime.LockOSThread()
		err := launchChild(spec, os.Args[2:])
		fail(spec.Status, err)
	case initArg0:
		var spec initSpec
		if json.Unmarshal([]byte(os.Args[1]), &spec) != nil || spec.Status < 3 {
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
	}
	_, _ = unix.Write(status, []byte(msg))
	os.Exit(127)
}

// launchChild turns this process (root, already in the session cgroup and
// namespaces) into a confined session process and executes the target. Every
// step runs on the one locked thread that calls execve; the credential
// changes go to all threads anyway.
func launchChild(spec launchSpec, argv []string) error {
	unix.CloseOnExec(spec.Status)
	unix.CloseOnExec(spec.ExeFD)
	if spec.Reaper != "" {
		// The run's own PID namespace: the reaper stays in the session's,
		// its child (the target) is pid 1 of the new one. (The agent cannot
		// clone into a new PID namespace itself after setns: the kernel
		// refuses CLONE_NEWPID while pid_ns_for_children is not the
		// caller's own.)
		if err := unix.Unshare(unix.CLONE_NEWPID); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWPID): %w", err)
		}
	}
	if !spec.Privileged {
		if err := dropPrivileges(spec.UID, spec.GID); err != nil {
			return err
		}
		if !spec.NoLandlock {
			if abi, _ := ll.LandlockGetABIVersion(); abi >= 6 {
				if err := landlock.MustConfig(landlock.ScopedSet(3)).RestrictScoped(); err != nil {
					return fmt.Errorf("landlock scope: %w", err)
				}
			}
		}
		if !spec.NoSeccomp {
			if err := loadFilter(spec.AllowUserNS); err != nil {
				return err
			}
		}
	}
	path := spec.Path
	if spec.Reaper != "" {
		argv = append([]string{spec.Reaper, "--", spec.Path}, argv[1:]...)
		path = spec.Reaper
	}
	return fmt.Errorf("exec %s: %w", path, syscall.Exec(path, argv, os.Environ()))
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
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(int(gid), int(gid), int(gid)); err != nil {
		return fmt.Errorf("setresgid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(int(uid), int(uid), int(uid)); err != nil {
		return fmt.Errorf("setresuid %d: %w", uid, err)
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
