package child

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CgroupMounts gives the session its own view of the cgroup2 hierarchy:
// every cgroup2 mount of this mount namespace is replaced by a read-only
// cgroup2 mount made from the caller's cgroup namespace, whose root is the
// session cgroup, so the session lists its own subtree only (not the other
// sessions under the parent). The host's cgroup v1 hierarchies (a hybrid
// host's controllers) are detached: a mount made before the cgroup
// namespace shows the whole host tree (every host service's cgroup and
// its usage), and the agent's v1 cgroups, which every session's processes
// share (sessions are placed in cgroup2 only), would be counters one
// session moves and another reads. It runs as root, in the session's mount and
// cgroup namespaces; mountinfo is this thread's mount table
// (/proc/thread-self/mountinfo). pid is a process that must be at the root
// of that cgroup namespace (in the session cgroup): checked first, so a
// namespace rooted anywhere else fails the session instead of showing more
// than its subtree.
func CgroupMounts(mountinfo string, pid string) error {
	own, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return fmt.Errorf("cgroup namespace: %w", err)
	}
	if !strings.Contains("\n"+string(own), "\n0::/\n") {
		return fmt.Errorf("cgroup namespace: not rooted at the session cgroup (%q)", strings.TrimSpace(string(own)))
	}
	v1, err := MountPoints(mountinfo, "cgroup")
	if err != nil {
		return err
	}
	// Deepest first: a v1 hierarchy mounted below another comes off before it.
	for i := len(v1) - 1; i >= 0; i-- {
		if err := unix.Unmount(v1[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detach the host's cgroup v1 hierarchy %s: %w", v1[i], err)
		}
	}
	points, err := MountPoints(mountinfo, "cgroup2")
	if err != nil {
		return err
	}
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detach %s: %w", p, err)
		}
		if err := unix.Mount("cgroup2", p, "cgroup2", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount the session's cgroup2 view on %s: %w", p, err)
		}
	}
	return nil
}

// MountPoints are the mount points of the mounts of filesystem type fstype
// in a mountinfo file, each once, in order.
func MountPoints(mountinfo, fstype string) ([]string, error) {
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 || g[0] != fstype {
			continue
		}
		p := unescape(f[4])
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
