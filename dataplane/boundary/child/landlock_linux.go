package child

import (
	"errors"
	"fmt"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// fileRights are the Landlock rights that apply to a file that is not a
// directory (a rule on such a file may hold no other).
const fileRights = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev

// landlockFS makes a Landlock domain that handles the filesystem rights fs
// and the IPC scopes scoped, allows every handled right beneath each of
// rules (a file: the file rights among them), and enters it on this
// thread, the one that executes the target. The rules are opened here,
// in the session's mount namespace (O_PATH, never following a symbolic
// link). A rule that no longer exists (ENOENT: removed since the agent
// listed it) or that Landlock refuses as a file (EINVAL: a symbolic link)
// gets no rule: less access, never more.
// Any other failure fails the launch.
//
// The same steps as landlock_fs in cmd/shinken-exec/shinken-exec.c.
func landlockFS(fs, scoped uint64, rules []string) error {
	fd, err := BuildRuleset(fs, scoped, rules)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := ll.LandlockRestrictSelf(fd, 0); err != nil {
		return fmt.Errorf("landlock: restrict self: %w", err)
	}
	return nil
}

// BuildRuleset makes the ruleset landlockFS enters (close-on-exec, as
// every Landlock ruleset fd): the rules opened by the calling thread, with
// its credentials and in its mount namespace. The agent builds a
// session's baseline with it once, on a thread in the session's mount
// namespace with the session's uid (package boundary, ruleset_linux.go).
func BuildRuleset(fs, scoped uint64, rules []string) (int, error) {
	fd, err := ll.LandlockCreateRuleset(&ll.RulesetAttr{HandledAccessFS: fs, Scoped: scoped}, 0)
	if err != nil {
		return -1, fmt.Errorf("landlock: create ruleset: %w", err)
	}
	for _, r := range rules {
		pfd, err := unix.Open(r, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("landlock: open rule %s: %w", r, err)
		}
		err = ll.LandlockAddPathBeneathRule(fd, &ll.PathBeneathAttr{AllowedAccess: fs, ParentFd: pfd}, 0)
		if errors.Is(err, unix.EINVAL) && fs&fileRights != 0 {
			// Not a directory: the file rights only. What is refused
			// even so (a symbolic link, opened with O_NOFOLLOW) gets no
			// rule.
			err = ll.LandlockAddPathBeneathRule(fd, &ll.PathBeneathAttr{AllowedAccess: fs & fileRights, ParentFd: pfd}, 0)
			if errors.Is(err, unix.EINVAL) {
				err = nil
			}
		}
		unix.Close(pfd)
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("landlock: rule %s: %w", r, err)
		}
	}
	return fd, nil
}

// landlockEnter enters the domain of a ruleset the agent built (the
// session's baseline, Launch.Ruleset) on this thread and closes the
// ruleset's descriptor: the target must not hold it (rules added to it
// would reach the session's next launches).
func landlockEnter(fd int) error {
	err := ll.LandlockRestrictSelf(fd, 0)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("landlock: restrict self (the session's ruleset): %w", err)
	}
	return nil
}
