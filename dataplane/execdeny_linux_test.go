package dataplane

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
)

// readExecEvents reads the events that arrive within wait.
func readExecEvents(t *testing.T, rd backend.EventReader, wait time.Duration) []backend.Event {
	t.Helper()
	var out []backend.Event
	rd.SetDeadline(time.Now().Add(wait))
	for {
		ev, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

// TestExecDenialEvents: a refused exec in a gated session is one event on
// the backend's stream (reason exec_denied, class process, the session's
// index and cgroup, the program's path, device and inode) and one count
// of (session, exec_denied) in the kernel's counters; an allowed exec, and
// any exec of a session not gated, is neither. A Read already waiting on
// the ring is woken by the exec denial.
func TestExecDenialEvents(t *testing.T) {
	d, _ := procSessions(t, "x1", "x2")
	rd, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	procGrant(t, d, "x1", HandleRef{}, 0, "/bin/sh", "/usr/bin/true")
	s1, _ := d.Session("x1")
	s2, _ := d.Session("x2")

	wantRun(t, d, "x1", "/usr/bin/true", true)
	wantRun(t, d, "x2", "/usr/bin/id", true) // not gated
	if evs := readExecEvents(t, rd, 300*time.Millisecond); len(evs) != 0 {
		t.Errorf("allowed execs made events: %+v", evs)
	}
	for _, s := range []Session{s1, s2} {
		if c, err := d.Counters(s.Index); err != nil || c[backend.ReasonExecDenied] != 0 {
			t.Errorf("%s: exec_denied=%d before any denial (%v)", s.Name, c[backend.ReasonExecDenied], err)
		}
	}

	// A reader already blocked on the ring gets the denial.
	got := make(chan []backend.Event, 1)
	go func() {
		var evs []backend.Event
		rd.SetDeadline(time.Now().Add(5 * time.Second))
		if ev, err := rd.Read(); err == nil {
			evs = append(evs, ev)
		}
		got <- evs
	}()
	time.Sleep(100 * time.Millisecond)
	wantRun(t, d, "x1", "/usr/bin/id", false)
	evs := <-got
	evs = append(evs, readExecEvents(t, rd, 300*time.Millisecond)...)
	if len(evs) != 1 {
		t.Fatalf("one refused exec: %d events %+v", len(evs), evs)
	}
	ev := evs[0]
	var st unix.Stat_t
	if err := unix.Stat("/usr/bin/id", &st); err != nil {
		t.Fatal(err)
	}
	switch {
	case ev.Reason != backend.ReasonExecDenied || ev.Reason.Class() != backend.ClassProcess:
		t.Errorf("reason %s (class %s), want exec_denied (process)", ev.Reason, ev.Reason.Class())
	case ev.Session != s1.Index || ev.CgroupID != s1.CgroupID:
		t.Errorf("session index %d cgroup %d, want %d %d", ev.Session, ev.CgroupID, s1.Index, s1.CgroupID)
	case ev.Inode != st.Ino || ev.Dev != kernelDev(uint64(st.Dev)):
		t.Errorf("file dev %d ino %d, want %d %d", ev.Dev, ev.Inode, kernelDev(uint64(st.Dev)), st.Ino)
	case !d.execLSMOn() && !strings.HasSuffix(ev.Path, "/usr/bin/id"):
		// (The BPF LSM's event names the file by device and inode only.)
		t.Errorf("path %q, want /usr/bin/id", ev.Path)
	case ev.PID == 0 || ev.Time.IsZero():
		t.Errorf("pid %d time %v", ev.PID, ev.Time)
	}
	if c, err := d.Counters(s1.Index); err != nil || c[backend.ReasonExecDenied] != 1 {
		t.Errorf("x1: exec_denied=%d after one refused exec, want 1 (%v)", c[backend.ReasonExecDenied], err)
	}
	if c, err := d.Counters(s2.Index); err != nil || c[backend.ReasonExecDenied] != 0 {
		t.Errorf("x2: exec_denied=%d, want 0 (%v)", c[backend.ReasonExecDenied], err)
	}
	t.Logf("event: %+v", ev)
}
