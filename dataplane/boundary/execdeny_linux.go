package boundary

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ExecDenial is one exec-open the gate refused, reported after its answer
// went to the kernel (the refused task never waits on the report).
type ExecDenial struct {
	// Session names the gated session whose task it was; empty when the
	// task's identity could not be read (it was gone): the refusal stands,
	// counted as no session's.
	Session string
	PID     uint32 // the task (thread) id
	Comm    string // its command name, best effort
	Dev     uint64 // the file's device (stat's st_dev)
	Ino     uint64
	Path    string // the file's path read from the refused descriptor, best effort
}

// OnExecDenial makes fn receive each exec denial of the gate, on the
// gate's own goroutine, after the kernel has its answer: fn must not block
// and must not wait on anything that may wait on an exec (another exec of
// a gated session waits for the gate until fn returns). Set it before the
// first SetProcess; nil stops the reports (the gate still counts them in
// ExecDenials).
func (b *Boundary) OnExecDenial(fn func(ExecDenial)) {
	b.exec.report.Store(&fn)
}

// reportDenial builds the denial of exec-open fd by task tid and hands it
// to the callback, if any.
func (b *Boundary) reportDenial(fd, tid int32, session string) {
	p := b.exec.report.Load()
	if p == nil || *p == nil {
		return
	}
	d := ExecDenial{Session: session, PID: uint32(tid)}
	var st unix.Stat_t
	if unix.Fstat(int(fd), &st) == nil {
		d.Dev, d.Ino = uint64(st.Dev), st.Ino
	}
	if path, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err == nil {
		d.Path = path
	}
	if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", tid)); err == nil {
		d.Comm = strings.TrimSuffix(string(c), "\n")
	}
	(*p)(d)
}
