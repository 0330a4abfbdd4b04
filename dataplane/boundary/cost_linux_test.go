package boundary

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCost prints what the boundary costs here (a measurement, not a
// benchmark: nothing is asserted on a shared machine): session creation,
// the holder's size, and a launch of /bin/true against a plain spawn.
func TestCost(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	const n = 20
	var create []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("cost%d", i)
		dir := filepath.Join(cgParent, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Release(name); removeCgroupTree(dir) })
		t0 := time.Now()
		if err := b.Create(name, dir, uint32(100+i)); err != nil {
			t.Fatal(err)
		}
		create = append(create, time.Since(t0))
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", b.holders["cost0"].pid))
	var facts []string
	for _, l := range strings.Split(string(st), "\n") {
		if strings.HasPrefix(l, "Threads:") || strings.HasPrefix(l, "VmRSS:") || strings.HasPrefix(l, "RssAnon:") {
			facts = append(facts, strings.Join(strings.Fields(l), " "))
		}
	}
	var launch, plain []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Dir: "/"}
		if err := b.Launch("cost0", cmd, LaunchOptions{}, true); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		launch = append(launch, time.Since(t0))
		t0 = time.Now()
		exec.Command("/bin/true").Run()
		plain = append(plain, time.Since(t0))
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	t.Logf("session create: median %v, max %v (%d sessions)", med(create), slices.Max(create), n)
	t.Logf("holder (catatonit -P): %s", strings.Join(facts, ", "))
	t.Logf("launch /bin/true through the boundary (own run cgroup): median %v; plain spawn median %v; ratio %.1f",
		med(launch), med(plain), float64(med(launch))/float64(med(plain)))
}
