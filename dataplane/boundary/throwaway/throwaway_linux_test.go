package throwaway

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// fromMain is what a Run whose goroutine started on the main thread did:
// init functions run on the main thread, so init hands run that thread.
var fromMain struct {
	onMain bool // init really ran on the main thread
	ranTid int  // the thread fn ran on
	err    error
}

func init() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fromMain.onMain = unix.Gettid() == unix.Getpid()
	errc := make(chan error, 1)
	run(func() error {
		fromMain.ranTid = unix.Gettid()
		return taint()
	}, errc)
	fromMain.err = <-errc
}

// taint changes what is per thread, as the session code does: its own
// filesystem context and a file-access uid.
func taint() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return err
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	unix.Setfsuid(65534)
	if fsuid(unix.Gettid()) != "65534" {
		return fmt.Errorf("setfsuid(65534) did not take on thread %d", unix.Gettid())
	}
	return nil
}

// fsuid reads a thread's file-system uid (the fourth field of Uid:).
func fsuid(tid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
	if err != nil {
		return "gone"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) == 4 {
				return f[3]
			}
		}
	}
	return "?"
}

// TestNeverTheMainThread: a Run whose goroutine lands on the main thread
// leaves that thread as it was and runs fn on another, which ends.
func TestNeverTheMainThread(t *testing.T) {
	kerneltest.RequireRoot(t)
	if !fromMain.onMain {
		t.Fatal("init did not run on the main thread: the test cannot hand it to run")
	}
	if fromMain.err != nil {
		t.Fatal(fromMain.err)
	}
	pid := unix.Getpid()
	if fromMain.ranTid == pid {
		t.Fatal("fn ran on the main thread")
	}
	if got := fsuid(pid); got != "0" {
		t.Fatalf("the main thread's fsuid is %s after a Run from it, want 0", got)
	}
	waitGone(t, fromMain.ranTid)
	t.Logf("verified: a Run started on the main thread (%d) ran on thread %d, which ended; the main thread kept fsuid 0", pid, fromMain.ranTid)
}

// TestManyRuns: concurrent Runs each get a thread of their own, never the
// main one, and every such thread ends.
func TestManyRuns(t *testing.T) {
	kerneltest.RequireRoot(t)
	pid := unix.Getpid()
	const n = 64
	tids := make([]int, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Run(func() error {
				tids[i] = unix.Gettid()
				if tids[i] == pid {
					return fmt.Errorf("run %d: fn on the main thread", i)
				}
				return taint()
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	seen := map[int]bool{}
	for _, tid := range tids {
		seen[tid] = true
	}
	if len(seen) != n {
		t.Errorf("%d runs used %d threads: a thread was reused after fn changed it", n, len(seen))
	}
	for _, tid := range tids {
		waitGone(t, tid)
	}
	if got := fsuid(pid); got != "0" {
		t.Fatalf("the main thread's fsuid is %s, want 0", got)
	}
}

func waitGone(t *testing.T, tid int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); fsuid(tid) != "gone"; {
		if time.Now().After(end) {
			t.Fatalf("thread %d still runs 10 s after its Run returned (fsuid %s)", tid, fsuid(tid))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
