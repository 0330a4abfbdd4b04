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
	fd, err := ll.LandlockCreateRuleset(&ll.RulesetAttr{HandledAccessFS: fs, Scoped: scoped}, 0)
	if err != nil {
		return fmt.Errorf("landlock: create ruleset: %w", err)
	}
	defer unix.Close(fd)
	for _, r := range rules {
		pfd, err := unix.Open(r, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("landlock: open rule %s: %w", r, err)
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
			return fmt.Errorf("landlock: rule %s: %w", r, err)
		}
	}
	if err := ll.LandlockRestrictSelf(fd, 0); err != nil {
		return fmt.Errorf("landlock: restrict self: %w", err)
	}
	return nil
}
