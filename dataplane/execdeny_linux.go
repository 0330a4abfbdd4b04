package dataplane

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// The exec gate (boundary, fanotify) decides in user space, so no BPF
// program counts or reports its denials: the agent does it the same way,
// in the same places. Each refusal adds one to the per-CPU counter of
// (session, exec_denied) in the pinned shk_counters (the slot of CPU 0; no
// program writes exec_denied slots on a host where this gate runs: where
// the exec LSM is attached, bpf/exec.bpf.c counts and reports its own and
// this gate is never armed, so each host has one writer of them), so
// it is never lost and survives an agent restart like the kernel's
// counts; then an Event goes to a bounded in-process queue that every
// EventReader reads besides the ring buffer (best effort as the ring: a
// full queue drops it and RingbufDrops counts it).

// execEventQueue bounds the exec denials waiting for a reader.
const execEventQueue = 1024

type execEvents struct {
	once  sync.Once
	ch    chan backend.Event
	drops atomic.Uint64

	cmu sync.Mutex // the exec_denied counter slots' read-modify-write

	rmu     sync.Mutex
	readers map[*EventReader]struct{} // woken (Flush) when an event is queued
}

func (x *execEvents) queue() chan backend.Event {
	x.once.Do(func() { x.ch = make(chan backend.Event, execEventQueue) })
	return x.ch
}

// execDenied is the boundary's OnExecDenial callback, on the gate's
// goroutine after its answer: it takes no lock a launch may hold (d.mu).
func (d *Dataplane) execDenied(x boundary.ExecDenial) {
	var s Session
	if v, ok := d.byName.Load(x.Session); ok && x.Session != "" {
		s = v.(Session)
	}
	// Index 0 when the task was unknown or its session is already gone:
	// the kernel's "no session" row.
	d.countExec(s.Index)
	ev := backend.Event{
		Time: time.Now(), CgroupID: s.CgroupID, Session: s.Index, PID: x.PID, Comm: x.Comm,
		Reason: backend.ReasonExecDenied, Dev: kernelDev(x.Dev), Inode: x.Ino, Path: x.Path,
	}
	select {
	case d.execEv.queue() <- ev:
	default:
		d.execEv.drops.Add(1)
		return
	}
	d.execEv.rmu.Lock()
	for r := range d.execEv.readers {
		_ = r.rd.Flush() // wakes a Read waiting on the ring; it takes the queue next
	}
	d.execEv.rmu.Unlock()
}

// countExec adds one to (index, exec_denied) in shk_counters.
func (d *Dataplane) countExec(index uint32) {
	if index >= d.cfg.MaxSessions {
		return
	}
	key := index*NumReasons + uint32(backend.ReasonExecDenied)
	d.execEv.cmu.Lock()
	defer d.execEv.cmu.Unlock()
	var per []uint64
	if err := d.objs.ShkCounters.Lookup(key, &per); err != nil || len(per) == 0 {
		return
	}
	d.markDenied(index) // before the count, as the programs' count() does
	per[0]++
	_ = d.objs.ShkCounters.Update(key, per, ebpf.UpdateExist)
}

// kernelDev turns stat's st_dev into the kernel's encoding (major<<20 |
// minor), the one fs.scope denials carry.
func kernelDev(dev uint64) uint32 {
	return unix.Major(dev)<<20 | unix.Minor(dev)
}
