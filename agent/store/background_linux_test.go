package store

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFoldThreadBackground: the fold runs on a thread at nice 19 that ends
// with it, so no other goroutine of the agent ever runs at that priority,
// and the writer's thread keeps its own.
func TestFoldThreadBackground(t *testing.T) {
	// The writer: this goroutine, on its own thread for the test.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// getpriority returns 20 - nice (x/sys/unix passes the raw value).
	p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := 20 - p
	if base >= backgroundNice {
		t.Skipf("the test runs at nice %d already: the fold's priority cannot be told apart", base)
	}
	dir := t.TempDir()
	s, st := openStore(t, dir)
	defer s.Close()
	st.Sessions["a"] = session("a", SessionActive)
	var (
		mu   sync.Mutex
		tid  int
		nice = -100
	)
	s.Fault = func(op string) error {
		if op == FaultSnapshot { // on the fold's goroutine
			p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
			mu.Lock()
			tid, nice = unix.Gettid(), 20-p
			if err != nil {
				nice = -200
			}
			mu.Unlock()
		}
		return nil
	}
	s.jbytes = minCompact // as if the journal had grown to the bound
	if err := s.Write([]string{SessionKey("a")}, true); err != nil {
		t.Fatal(err)
	}
	s.waitFold()
	mu.Lock()
	defer mu.Unlock()
	if tid == 0 {
		t.Fatal("no fold ran")
	}
	if nice != backgroundNice {
		t.Fatalf("the fold's thread ran at nice %d, want %d", nice, backgroundNice)
	}
	if p, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err != nil || 20-p != base {
		t.Fatalf("the writer's thread is at nice %d (%v), want %d as before the fold", 20-p, err, base)
	}
	threadEnds(t, tid)
}

// threadEnds waits until thread tid of this process is gone: the runtime
// ends a locked thread whose goroutine returned.
func threadEnds(t *testing.T, tid int) {
	t.Helper()
	task := "/proc/self/task/" + strconv.Itoa(tid)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fold's thread %d still exists 5 s after the fold: a thread at nice %d went back to the runtime", tid, backgroundNice)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fromMain is backgroundThread called on the main thread: from an init
// function, which the runtime runs there, locked. A fold's goroutine can
// land there too (CI once saw its thread outlive the fold: the runtime
// parks the main thread for good instead of ending it).
var fromMain struct {
	caller, before, after int // the calling thread, its nice before and after
	tid, nice             int // the thread f ran on, and its nice
}

func init() {
	p, _ := unix.Getpriority(unix.PRIO_PROCESS, 0)
	fromMain.caller, fromMain.before = unix.Gettid(), 20-p
	backgroundThread(func() {
		p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
		fromMain.tid, fromMain.nice = unix.Gettid(), 20-p
		if err != nil {
			fromMain.nice = -200
		}
	})
	p, _ = unix.Getpriority(unix.PRIO_PROCESS, 0)
	fromMain.after = 20 - p
}

// TestFoldThreadNotMain: called on the main thread, backgroundThread runs
// its work on another thread at nice 19, which then ends, and leaves the
// main thread at its own priority.
func TestFoldThreadNotMain(t *testing.T) {
	r := fromMain
	if r.caller != os.Getpid() {
		t.Fatalf("init ran on thread %d, not the main thread %d", r.caller, os.Getpid())
	}
	if r.before >= backgroundNice {
		t.Skipf("the test runs at nice %d already: the fold's priority cannot be told apart", r.before)
	}
	if r.tid == 0 || r.tid == os.Getpid() {
		t.Fatalf("the work ran on thread %d, the main thread %d", r.tid, os.Getpid())
	}
	if r.nice != backgroundNice || r.after != r.before {
		t.Fatalf("the work ran at nice %d (want %d), the main thread at %d after it (want %d)", r.nice, backgroundNice, r.after, r.before)
	}
	threadEnds(t, r.tid)
}
