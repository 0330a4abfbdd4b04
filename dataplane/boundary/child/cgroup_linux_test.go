package child

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestCgroupTmpfs (no root): the one-unmount path of CgroupMounts is taken
// exactly where detaching the tmpfs takes the cgroup mounts and nothing
// else with it; every other layout detaches the hierarchies one by one.
func TestCgroupTmpfs(t *testing.T) {
	line := func(id, parent int, point, fstype string) string {
		return fmt.Sprintf("%d %d 0:%d / %s rw,relatime - %s %s rw", id, parent, id, point, fstype, fstype)
	}
	hybrid := []string{
		line(22, 1, "/sys", "sysfs"),
		line(30, 22, "/sys/fs/cgroup", "tmpfs"),
		line(31, 30, "/sys/fs/cgroup/cpu", "cgroup"),
		line(32, 30, "/sys/fs/cgroup/pids", "cgroup"),
		line(40, 30, "/sys/fs/cgroup/unified", "cgroup2"),
		line(41, 22, "/sys/fs/bpf", "bpf"),
	}
	for _, c := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"hybrid, as systemd mounts it", hybrid, "/sys/fs/cgroup"},
		{"cgroup2 only", []string{line(22, 1, "/sys", "sysfs"), line(30, 22, "/sys/fs/cgroup", "cgroup2")}, ""},
		{"something else on the tmpfs", append(slices.Clone(hybrid), line(50, 30, "/sys/fs/cgroup/other", "tmpfs")), ""},
		{"a mount stacked on the tmpfs", append(slices.Clone(hybrid), line(50, 30, "/sys/fs/cgroup", "tmpfs")), ""},
		{"a mount on a hierarchy", append(slices.Clone(hybrid), line(50, 31, "/sys/fs/cgroup/cpu/x", "tmpfs")), ""},
		{"a hierarchy elsewhere", append(slices.Clone(hybrid), line(50, 1, "/cgroup-v1", "cgroup")), ""},
		{"not on a tmpfs", []string{line(22, 1, "/sys", "sysfs"), line(31, 22, "/sys/cpu", "cgroup"), line(40, 22, "/sys/unified", "cgroup2")}, ""},
		{"on the root", []string{line(1, 0, "/", "tmpfs"), line(31, 1, "/cpu", "cgroup")}, ""},
	} {
		under, ok := cgroupTmpfs(parseMountinfo(strings.Join(c.lines, "\n") + "\n"))
		if ok != (c.want != "") || under != c.want {
			t.Errorf("%s: %q %v, want %q", c.name, under, ok, c.want)
		}
	}
	if got := pointsOf(parseMountinfo(strings.Join(hybrid, "\n")), "cgroup2"); !slices.Equal(got, []string{"/sys/fs/cgroup/unified"}) {
		t.Errorf("cgroup2 points: %q", got)
	}
}
