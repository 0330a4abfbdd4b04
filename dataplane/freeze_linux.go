package dataplane

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// FreezeTimeout bounds Freeze's wait for the kernel to report a session
// cgroup frozen (or thawed).
const FreezeTimeout = 5 * time.Second

// Freeze writes the session cgroup's cgroup.freeze and waits until
// cgroup.events says "frozen 1" (or 0): freezing is asynchronous, every
// task of the subtree is stopped at its next return to user space. A
// process that joins a frozen cgroup stops at once. What freezing does not
// stop: the kernel keeps receiving for the session's sockets (until their
// buffers fill, then peers see a zero window or drops), its timers keep
// running (they fire, late, at thaw: clocks jump), and processes outside
// the cgroup (a process's shim) are not frozen.
func (d *Dataplane) Freeze(session string, frozen bool) error {
	s, err := d.Session(session)
	if err != nil {
		return err
	}
	v, want := "0", []byte("frozen 0")
	if frozen {
		v, want = "1", []byte("frozen 1")
	}
	if err := os.WriteFile(filepath.Join(s.Path, "cgroup.freeze"), []byte(v), 0); err != nil {
		return fmt.Errorf("dataplane: freeze %s: %w", session, err)
	}
	deadline := time.Now().Add(FreezeTimeout)
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 20*time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(s.Path, "cgroup.events"))
		if err != nil {
			return fmt.Errorf("dataplane: freeze %s: %w", session, err)
		}
		if bytes.Contains(b, want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dataplane: freeze %s: cgroup.events not %q after %v", session, want, FreezeTimeout)
		}
		time.Sleep(wait)
	}
}

// Frozen reads the session cgroup's cgroup.events.
func (d *Dataplane) Frozen(session string) (bool, error) {
	s, err := d.Session(session)
	if err != nil {
		return false, err
	}
	b, err := readKernfs(filepath.Join(s.Path, "cgroup.events"))
	if err != nil {
		return false, fmt.Errorf("dataplane: %s: %w", session, err)
	}
	return bytes.Contains(b, []byte("frozen 1")), nil
}

// readKernfs reads a small cgroup file with open, read and close alone:
// the agent's start asks every session's cgroup.events (is it frozen?),
// and os.ReadFile's fstat, fcntl and poller registration (cgroup files
// can be polled) tripled the system calls of each read.
func readKernfs(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

var _ backend.Freezer = (*Dataplane)(nil)
