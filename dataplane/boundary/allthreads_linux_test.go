package boundary

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// setgroupsAllThreads sets this process's supplementary groups with
// syscall.Setgroups, which runs setgroups on every thread of the process
// (the runtime's AllThreadsSyscall) and aborts the whole process ("results
// differ between threads; runtime corrupted") when one thread's call fails.
// The session's ruleset is built on a thread that drops every capability
// (ruleset_linux.go) and ends with its work (package throwaway), a moment
// after the launch that needed it. So first wait until every thread of
// the process has the same credentials as the main thread, holding
// buildGate so that no build starts meanwhile: then none is a build
// thread. (The agent itself never calls an all-threads credential
// syscall.) The CI VM's run once waited here for 20 s in vain: the build
// had run on the main thread, which Go parks rather than ends, so the
// main thread itself kept the session's credentials; throwaway.Run now
// never runs on it.
func setgroupsAllThreads(t *testing.T, groups []int) {
	t.Helper()
	// No build starts from here until Setgroups is done (a background
	// prebuild of a session made earlier could, between the wait and the
	// call).
	buildGate.Lock()
	defer buildGate.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for {
		odd, err := threadsWithOtherCreds()
		if err != nil {
			t.Fatal(err)
		}
		if odd == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a thread of this process still has other credentials after 20 s: %s", odd)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Setgroups(groups); err != nil {
		t.Fatal(err)
	}
}

// threadsWithOtherCreds names a thread whose uids, gids, groups or
// effective capabilities differ from the process leader's ("" if none).
func threadsWithOtherCreds() (string, error) {
	creds := func(status string) string {
		var keep []string
		for _, l := range strings.Split(status, "\n") {
			for _, k := range []string{"Uid:", "Gid:", "Groups:", "CapEff:", "CapPrm:"} {
				if strings.HasPrefix(l, k) {
					keep = append(keep, strings.Join(strings.Fields(l), " "))
				}
			}
		}
		return strings.Join(keep, "; ")
	}
	lead, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "", err
	}
	want := creds(string(lead))
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		return "", err
	}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		if got := creds(string(b)); got != want {
			return p + ": " + got, nil
		}
	}
	return "", nil
}
