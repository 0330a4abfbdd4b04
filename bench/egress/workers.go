//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// Workers: probe processes inside a session, driven line by line.

type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func (b *bench) copyProbe() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// Under /var/tmp: a session's /tmp is its own.
	dir, err := os.MkdirTemp("/var/tmp", "shinken-bench-")
	if err != nil {
		return err
	}
	b.probeDir = dir
	os.Chmod(dir, 0o755)
	data, err := os.ReadFile(self)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "probe"), data, 0o755)
}

func (b *bench) worker(s dataplane.Session) (*worker, error) {
	cmd := exec.Command(filepath.Join(b.probeDir, "probe"))
	cmd.Env = []string{probe.EnvVar + "=1"}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := b.start(s, cmd); err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	b.mu.Lock()
	b.procs = append(b.procs, w)
	b.mu.Unlock()
	return w, nil
}

func (w *worker) send(line string) error {
	_, err := io.WriteString(w.in, line+"\n")
	return err
}

func (w *worker) recv() (string, error) {
	if !w.out.Scan() {
		return "", fmt.Errorf("worker died: %v", w.out.Err())
	}
	return w.out.Text(), nil
}

func (w *worker) do(line string) string {
	if err := w.send(line); err != nil {
		return "err " + err.Error()
	}
	s, err := w.recv()
	if err != nil {
		return "err " + err.Error()
	}
	return s
}

func (w *worker) stop() {
	w.in.Close()
	done := make(chan struct{})
	go func() { w.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		w.cmd.Process.Kill()
		<-done
	}
}
