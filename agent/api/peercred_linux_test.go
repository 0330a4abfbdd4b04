package api

import (
	"os"
	"path"
	"strings"
	"testing"
)

func TestInCgroup(t *testing.T) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	own := ""
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			own = rest
		}
	}
	if own == "" {
		t.Fatal("no cgroup2 line in /proc/self/cgroup")
	}
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
