package dataplane

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
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
	b, err := os.ReadFile(filepath.Join(s.Path, "cgroup.events"))
	if err != nil {
		return false, fmt.Errorf("dataplane: %s: %w", session, err)
	}
	return bytes.Contains(b, []byte("frozen 1")), nil
}

var _ backend.Freezer = (*Dataplane)(nil)
