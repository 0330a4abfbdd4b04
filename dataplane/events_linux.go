package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/shinken-agent/shinken/agent/backend"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// EventReader reads denial events from the kernel ring buffer and the
// exec gate's queue (execdeny_linux.go).
type EventReader struct {
	rd   *ringbuf.Reader
	exec *execEvents
}

// Events opens a reader on the denial ring buffer and the exec gate's
// denials. Close it to unblock Read.
func (d *Dataplane) Events() (backend.EventReader, error) {
	rd, err := ringbuf.NewReader(d.objs.ShkEvents)
	if err != nil {
		return nil, fmt.Errorf("open event ring: %w", err)
	}
	r := &EventReader{rd: rd, exec: &d.execEv}
	r.exec.rmu.Lock()
	if r.exec.readers == nil {
		r.exec.readers = map[*EventReader]struct{}{}
	}
	r.exec.readers[r] = struct{}{}
	r.exec.rmu.Unlock()
	return r, nil
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t.
func (r *EventReader) SetDeadline(t time.Time) { r.rd.SetDeadline(t) }

// Read blocks until the next event: an exec denial queued, else the
// ring's next (a queued exec denial wakes a Read waiting on the ring).
func (r *EventReader) Read() (Event, error) {
	var rec ringbuf.Record
	for {
		select {
		case e := <-r.exec.queue():
			return e, nil
		default:
		}
		var err error
		rec, err = r.rd.Read()
		if errors.Is(err, ringbuf.ErrFlushed) {
			continue
		}
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return Event{}, os.ErrClosed
			}
			return Event{}, err
		}
		break
	}
	var raw shkShkEvent
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
		return Event{}, fmt.Errorf("decode event: %w", err)
	}
	return decodeEvent(&raw), nil
}

// Close stops the reader.
func (r *EventReader) Close() error {
	r.exec.rmu.Lock()
	delete(r.exec.readers, r)
	r.exec.rmu.Unlock()
	return r.rd.Close()
}

func decodeEvent(raw *shkShkEvent) Event {
	e := Event{
		Time:     bootToTime(raw.TsNs),
		CgroupID: raw.CgroupId,
		Session:  raw.Session,
		PID:      raw.Pid,
		Reason:   Reason(raw.Reason),
		Proto:    Proto(raw.Proto),
	}
	var comm []byte
	for _, c := range raw.Comm {
		if c == 0 {
			break
		}
		comm = append(comm, byte(c))
	}
	e.Comm = string(comm)
	if e.Reason.Class() == backend.ClassFSScope || e.Reason == backend.ReasonExecDenied {
		// files.bpf.c and exec.bpf.c: daddr holds the inode number (low, high word) and
		// the device; proto the access asked.
		e.Proto, e.Access = 0, raw.Proto
		e.Inode = uint64(binary.NativeEndian.Uint32(raw.Daddr[0:])) | uint64(binary.NativeEndian.Uint32(raw.Daddr[4:]))<<32
		e.Dev = binary.NativeEndian.Uint32(raw.Daddr[8:])
		return e
	}
	var addr netip.Addr
	if raw.Family == unix.AF_INET6 {
		addr = netip.AddrFrom16(raw.Daddr)
	} else {
		addr = netip.AddrFrom4([4]byte(raw.Daddr[:4]))
	}
	e.Dst = netip.AddrPortFrom(addr, raw.Dport)
	return e
}

// ProcOptions says who a session process runs as.
type ProcOptions = backend.LaunchOptions

// Nobody is the default identity of session processes.
const Nobody = 65534

// StartIn starts cmd inside session s: the child is created directly in the
// session cgroup (clone3 CLONE_INTO_CGROUP), so not a single instruction of it
// runs outside, and with the credentials of opts.
func StartIn(s Session, cmd *exec.Cmd, opts ProcOptions) error {
	fd, err := unix.Open(s.Path, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open session cgroup %s: %w", s.Path, err)
	}
	defer unix.Close(fd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = fd
	if !opts.Privileged {
		uid, gid := opts.UID, opts.GID
		if uid == 0 && gid == 0 {
			uid, gid = Nobody, Nobody
		}
		if uid == 0 {
			return fmt.Errorf("start in session %s: uid 0 requires Privileged", s.Name)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
		cmd.SysProcAttr.AmbientCaps = nil
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start in session %s: %w", s.Name, err)
	}
	return nil
}
