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
// than its subtree. Where one tmpfs holds every cgroup mount and nothing
// else, it is replaced as a whole (cgroupMountsAtOnce).
func CgroupMounts(mountinfo string, pid string) error {
	own, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return fmt.Errorf("cgroup namespace: %w", err)
	}
	if !strings.Contains("\n"+string(own), "\n0::/\n") {
		return fmt.Errorf("cgroup namespace: not rooted at the session cgroup (%q)", strings.TrimSpace(string(own)))
	}
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		return err
	}
	mounts := parseMountinfo(string(data))
	if under, ok := cgroupTmpfs(mounts); ok {
		return cgroupMountsAtOnce(under, pointsOf(mounts, "cgroup2"))
	}
	v1 := pointsOf(mounts, "cgroup")
	// Deepest first: a v1 hierarchy mounted below another comes off before it.
	for i := len(v1) - 1; i >= 0; i-- {
		if err := unix.Unmount(v1[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detach the host's cgroup v1 hierarchy %s: %w", v1[i], err)
		}
	}
	for _, p := range pointsOf(mounts, "cgroup2") {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detach %s: %w", p, err)
		}
		if err := mountCgroup2(p); err != nil {
			return err
		}
	}
	return nil
}

func mountCgroup2(p string) error {
	if err := unix.Mount("cgroup2", p, "cgroup2", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount the session's cgroup2 view on %s: %w", p, err)
	}
	return nil
}

// cgroupMountsAtOnce is CgroupMounts where every cgroup mount lies directly
// on one tmpfs that holds nothing else (a hybrid host's /sys/fs/cgroup, as
// systemd mounts it): that tmpfs and every hierarchy on it are detached in
// one unmount, and an empty read-only tmpfs takes its place, holding only
// the session's cgroup2 views at the cgroup2 mount points. Each unmount
// waits for an expedited RCU grace period, which interrupts every CPU of
// the host: one for the whole tree instead of one per hierarchy (ten on
// this project's hosts; about 0.5 ms less per session start here:
// bench/README.md, the twenty-third session).
func cgroupMountsAtOnce(under string, v2 []string) error {
	if err := unix.Unmount(under, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's cgroup mounts at %s: %w", under, err)
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", under, "tmpfs", flags, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("mount an empty tmpfs on %s: %w", under, err)
	}
	for _, p := range v2 {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("cgroup2 mount point: %w", err)
		}
		if err := mountCgroup2(p); err != nil {
			return err
		}
	}
	if err := unix.Mount("", under, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", under, err)
	}
	return nil
}

// mountEntry is one line of a mountinfo file.
type mountEntry struct {
	id, parent int
	point      string
	fstype     string
}

func parseMountinfo(data string) []mountEntry {
	var out []mountEntry
	for _, l := range strings.Split(data, "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 {
			continue
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, mountEntry{id: id, parent: parent, point: unescape(f[4]), fstype: g[0]})
	}
	return out
}

// pointsOf are the mount points of the mounts of filesystem type fstype,
// each once, in order.
func pointsOf(mounts []mountEntry, fstype string) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range mounts {
		if m.fstype == fstype && !seen[m.point] {
			seen[m.point] = true
			out = append(out, m.point)
		}
	}
	return out
}

// cgroupTmpfs is the mount point of the tmpfs that every cgroup and
// cgroup2 mount lies directly on, when there is one and nothing else is
// mounted on it or on them (so that detaching it takes exactly the cgroup
// mounts with it); ok false otherwise, and on a host with no cgroup v1
// hierarchy (one cgroup2 mount is one unmount either way).
func cgroupTmpfs(mounts []mountEntry) (string, bool) {
	parent, cg, v1 := -1, map[int]bool{}, false
	for _, m := range mounts {
		if m.fstype != "cgroup" && m.fstype != "cgroup2" {
			continue
		}
		if parent != -1 && m.parent != parent {
			return "", false
		}
		parent, cg[m.id], v1 = m.parent, true, v1 || m.fstype == "cgroup"
	}
	if !v1 {
		return "", false
	}
	under := ""
	for _, m := range mounts {
		switch {
		case m.id == parent:
			if m.fstype != "tmpfs" || under != "" {
				return "", false
			}
			under = m.point
		case m.parent == parent && !cg[m.id], cg[m.parent]:
			return "", false // something else on the tmpfs, or on a hierarchy
		}
	}
	if under == "" || under == "/" {
		return "", false
	}
	for _, m := range mounts {
		if cg[m.id] && !strings.HasPrefix(m.point, under+"/") {
			return "", false
		}
	}
	return under, true
}

// MountPoints are the mount points of the mounts of filesystem type fstype
// in a mountinfo file, each once, in order.
func MountPoints(mountinfo, fstype string) ([]string, error) {
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	return pointsOf(parseMountinfo(string(data)), fstype), nil
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
