package api

import (
	"os"
	"path"
	"strings"
	"testing"
)

// ownCgroup is this test process's cgroup2 path (the "0::" line of
// /proc/self/cgroup).
func ownCgroup(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return rest
		}
	}
	t.Fatal("no cgroup2 line in /proc/self/cgroup")
	return ""
}

func TestInCgroup(t *testing.T) {
	own := ownCgroup(t)
	pid := int32(os.Getpid())
	if !inCgroup(pid, own) {
		t.Errorf("inCgroup(self, %q) = false, want true", own)
	}
	if own != "/" && !inCgroup(pid, path.Dir(own)) {
		t.Errorf("inCgroup(self, %q) = false, want true (below it)", path.Dir(own))
	}
	if inCgroup(pid, own+"-sibling") {
		t.Errorf("inCgroup(self, %q) = true: a name prefix is not a parent", own+"-sibling")
	}
	if inCgroup(pid, "/shinken-no-such-cgroup") {
		t.Error("inCgroup(self, /shinken-no-such-cgroup) = true")
	}
	if !inCgroup(1<<30, "/shinken-no-such-cgroup") {
		t.Error("a process whose cgroup cannot be read must count as inside (fail closed)")
	}
}
