//go:build linux

package probe

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns a copy of the running (test) binary that an unprivileged
// session process can execute: go test builds into a 0700 directory. Call
// Cleanup from TestMain after the tests to remove it.
func Binary(t testing.TB) string {
	binOnce.Do(func() {
		self, err := os.Executable()
		if err != nil {
			binErr = err
			return
		}
		dir, err := os.MkdirTemp("", "shinken-probe-")
		if err != nil {
			binErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			binErr = err
			return
		}
		data, err := os.ReadFile(self)
		if err != nil {
			binErr = err
			return
		}
		p := filepath.Join(dir, "probe")
		if err := os.WriteFile(p, data, 0o755); err != nil {
			binErr = err
			return
		}
		binPath = p
	})
	if binErr != nil || binPath == "" {
		t.Fatalf("probe binary: %v", binErr)
	}
	return binPath
}

// Cleanup removes the copy Binary made, if any.
func Cleanup() {
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
}

// Proc is a probe process inside a session, answering one line per command.
type Proc struct {
	t   testing.TB
	Cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// Start runs Binary(t) in probe mode through start (which places it in the
// session, e.g. dataplane.Session.Start) and stops it when the test ends.
func Start(t testing.TB, start func(*exec.Cmd) error) *Proc {
	return StartEnv(t, []string{EnvVar + "=1"}, start)
}

// StartEnv is Start with another environment, for test binaries that serve
// a protocol of their own under another variable.
func StartEnv(t testing.TB, env []string, start func(*exec.Cmd) error) *Proc {
	t.Helper()
	cmd := exec.Command(Binary(t))
	cmd.Env = env
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := start(cmd); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	p := &Proc{t: t, Cmd: cmd, in: in, out: sc}
	t.Cleanup(p.Stop)
	return p
}

// Do sends one command and returns the answer line; a dead process fails
// the test.
func (p *Proc) Do(line string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		p.t.Fatalf("probe %q: %v", line, err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("probe %q: no answer (%v)", line, p.out.Err())
	}
	return p.out.Text()
}

// DoAsync is Do for use from another goroutine: errors come back as
// "err ..." lines instead of failing the test.
func (p *Proc) DoAsync(line string) string {
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		return "err " + err.Error()
	}
	if !p.out.Scan() {
		return "err no answer"
	}
	return p.out.Text()
}

// Stop closes the process's input and waits for it (killing it after 5 s).
func (p *Proc) Stop() {
	p.in.Close()
	done := make(chan struct{})
	go func() { p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.Cmd.Process.Kill()
		<-done
	}
}
