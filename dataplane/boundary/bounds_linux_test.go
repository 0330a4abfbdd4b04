package boundary

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// fill (in a session): writes 1 MiB blocks to each file named in args until
// a write fails or 64 MiB are written; one RESULT line per file, ok=true
// when the write failed with ENOSPC.
func fill(args []string) int {
	block := make([]byte, 1<<20)
	for _, name := range args {
		f, err := os.Create(name)
		if err != nil {
			fmt.Printf("RESULT op=%s ok=false n=0 err=%v\n", name, err)
			continue
		}
		n := 0
		for ; n < 64<<20 && err == nil; n += len(block) {
			var w int
			w, err = f.Write(block)
			if err != nil {
				n += w - len(block)
			}
		}
		f.Close()
		os.Remove(name)
		fmt.Printf("RESULT op=%s ok=%v n=%d err=%v\n", name, errors.Is(err, unix.ENOSPC), n, err)
	}
	return 0
}

// forkLoop (in a session): starts `sleep 60` until a start fails or
// args[0] are running, and leaves them running; ok=true when the start
// failed with EAGAIN. n is how many it started.
func forkLoop(args []string) int {
	limit, _ := strconv.Atoi(args[0])
	n, err := 0, error(nil)
	for ; n < limit; n++ {
		cmd := exec.Command("/bin/sleep", "60")
		if err = cmd.Start(); err != nil {
			break
		}
		_ = cmd.Process.Release()
	}
	fmt.Printf("RESULT op=fork ok=%v n=%d err=%v\n", errors.Is(err, syscall.EAGAIN), n, err)
	return 0
}

// resultField is field key= of a RESULT value ("ok=true n=3 err=...").
func resultField(res, key string) string {
	for _, f := range strings.Fields(res) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestTmpfsSize (issue 23, build item 6): a session's /tmp and /dev/shm
// are tmpfs mounts of Config.TmpfsBytes each: writing past it fails with
// ENOSPC.
func TestTmpfsSize(t *testing.T) {
	const size = 4 << 20
	b := newBoundary(t, Config{TmpfsBytes: size}, nil)
	session(t, b, "tmpfs", 11)
	out := runIn(t, b, "tmpfs", helper("fill", nil, "/tmp/fill", "/dev/shm/fill"), false)
	res := results(out)
	for _, f := range []string{"/tmp/fill", "/dev/shm/fill"} {
		r, ok := res[f]
		if !ok {
			t.Fatalf("no result for %s:\n%s", f, out)
		}
		n, _ := strconv.Atoi(resultField(r, "n"))
		if resultField(r, "ok") != "true" || n > size {
			t.Errorf("%s: %s (want ENOSPC at most %d bytes in)", f, r, size)
		}
	}
}

// TestNProcBound (issue 23, build item 6): a fork loop in session A stops
// at Config.MaxProcs (EAGAIN), counted on A's own uid, while session B
// still starts processes, and forks in them.
func TestNProcBound(t *testing.T) {
	const maxProcs = 32
	b := newBoundary(t, Config{MaxProcs: maxProcs}, nil)
	session(t, b, "forka", 12)
	session(t, b, "forkb", 13)
	out := runIn(t, b, "forka", helper("forkloop", []string{"GOMAXPROCS=1"}, strconv.Itoa(4*maxProcs)), false)
	r, ok := results(out)["fork"]
	if !ok {
		t.Fatalf("no fork result:\n%s", out)
	}
	n, _ := strconv.Atoi(resultField(r, "n"))
	if resultField(r, "ok") != "true" || n >= maxProcs || n < maxProcs-16 {
		t.Fatalf("fork loop in A: %s (want EAGAIN after fewer than %d processes, the helper's threads counted)", r, maxProcs)
	}
	uidA, _ := b.UID(12)
	if c := uidTasks(t, uidA); c > maxProcs {
		t.Errorf("session A's uid %d has %d tasks, more than its bound %d", uidA, c, maxProcs)
	}
	cmd := exec.Command("/bin/sh", "-c", "/bin/true & wait $! && echo B-FORKED")
	if out := runIn(t, b, "forkb", cmd, false); !strings.Contains(out, "B-FORKED") {
		t.Errorf("session B could not start a process while A is at its bound: %q", out)
	}
}

// uidTasks counts the host's tasks (threads included) of uid.
func uidTasks(t *testing.T, uid uint32) int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		tasks, err := os.ReadDir("/proc/" + p.Name() + "/task")
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+p.Name(), &st) == nil && st.Uid == uid {
			n += len(tasks)
		}
	}
	return n
}

// TestReportBounds: the report has a probed row for each bound.
func TestReportBounds(t *testing.T) {
	b := newBoundary(t, Config{TmpfsBytes: 8 << 20, MaxProcs: 100}, nil)
	want := map[backend.Class]string{MechTmpfsSize: "8388608 bytes", MechNProc: "RLIMIT_NPROC 100"}
	for _, r := range b.Report() {
		if w, ok := want[r.Class]; ok {
			if r.Level != backend.FixedAtExec || !strings.Contains(r.Mechanism, w) {
				t.Errorf("%s: %s %q (%s), want fixed at exec mentioning %q", r.Class, r.Level, r.Mechanism, r.Reason, w)
			}
			delete(want, r.Class)
		}
	}
	for c := range want {
		t.Errorf("no report row %q", c)
	}
}
