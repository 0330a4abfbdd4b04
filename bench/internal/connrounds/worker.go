//go:build linux

package connrounds

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/dataplane/probe"
)

// CopyProbe copies this executable to a new directory under /var/tmp (a
// session's /tmp is its own), readable by every uid, as dir/probe: the
// binary the workers run, reachable from inside a session. The caller
// removes dir.
func CopyProbe(prefix string) (dir string, err error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if dir, err = os.MkdirTemp("/var/tmp", prefix); err != nil {
		return "", err
	}
	os.Chmod(dir, 0o755)
	data, err := os.ReadFile(self)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "probe"), data, 0o755)
	}
	return dir, err
}

// Worker is a probe process (probe.Main) inside a session, driven line by
// line: a command on its stdin, one answer line on its stdout.
type Worker struct {
	Cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// StartWorker runs the probe at path (from CopyProbe) with its working
// directory dir ("" for the bench's), started by start (through the
// session launcher, or into a plain cgroup).
func StartWorker(path, dir string, start func(*exec.Cmd) error) (*Worker, error) {
	cmd := exec.Command(path)
	cmd.Env = []string{probe.EnvVar + "=1"}
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := start(cmd); err != nil {
		return nil, err
	}
	return &Worker{Cmd: cmd, in: in, out: bufio.NewScanner(out)}, nil
}

// Send writes one command line.
func (w *Worker) Send(line string) error {
	_, err := io.WriteString(w.in, line+"\n")
	return err
}

// Recv reads one answer line.
func (w *Worker) Recv() (string, error) {
	if !w.out.Scan() {
		return "", fmt.Errorf("worker died: %v", w.out.Err())
	}
	return w.out.Text(), nil
}

// Do sends line and returns the answer, or "err ..." when the worker
// could not be written to or read from.
func (w *Worker) Do(line string) string {
	if err := w.Send(line); err != nil {
		return "err " + err.Error()
	}
	s, err := w.Recv()
	if err != nil {
		return "err " + err.Error()
	}
	return s
}

// Stop closes the worker's stdin (it exits) and waits for it; after 3
// seconds it kills it.
func (w *Worker) Stop() {
	w.in.Close()
	done := make(chan struct{})
	go func() { w.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		w.Cmd.Process.Kill()
		<-done
	}
}

// MoveTo moves the worker's process into cgroup cg (sockets belong to the
// cgroup of the task that creates them).
func (w *Worker) MoveTo(cg string) error {
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(w.Cmd.Process.Pid)), 0); err != nil {
		return fmt.Errorf("move the worker to %s: %w", cg, err)
	}
	return nil
}

// TID is the host's id of the worker's command thread (probe.Main locks
// the work to it), for sched_setaffinity and sched_setscheduler.
func (w *Worker) TID() (int, error) {
	var tid int
	if _, err := fmt.Sscanf(w.Do("tid"), "ok %d", &tid); err != nil {
		return 0, fmt.Errorf("worker thread id: %w", err)
	}
	return HostTID(w.Cmd.Process.Pid, tid), nil
}

// HostTID maps a thread id that process pid reports from inside its
// session's PID namespace to the host's.
func HostTID(pid, nsTID int) int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 && f[len(f)-1] == strconv.Itoa(nsTID) {
					id, _ := strconv.Atoi(t.Name())
					return id
				}
			}
		}
	}
	return nsTID // same namespace
}
