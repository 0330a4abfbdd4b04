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
	// The runtime ends a locked thread whose goroutine returned.
	task := "/proc/self/task/" + strconv.Itoa(tid)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fold's thread %d still exists 5 s after the fold: a thread at nice %d went back to the runtime", tid, backgroundNice)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
