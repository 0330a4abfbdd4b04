package dataplane

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The denied marker (bpf/events.bpf.h): shk_denied holds one bit per
// session index, set by the programs on the index's first denial, before
// its counter is added to. A session's counters are all zero while its bit
// is clear, so CountersOf reads the counters of marked indices only: a
// scrape of many sessions of which few ever denied reads a bitmap of
// MaxSessions/8 bytes (mmapped: no system call) and the counters of those
// few, not MaxSessions*NumReasons per-CPU slots.
//
// Every bit of a word may be set by a program on any CPU at any time, so
// user space changes a bit only with an atomic operation on the mapped
// word (never a read, modify and write of the word through a map update,
// which could undo a program's set of another session's bit).

// deniedBits is the mapping of shk_denied.
type deniedBits struct {
	mu  sync.RWMutex // guards mem against unmap
	mem []byte       // nil before map and after unmap
}

// deniedWords is shk_denied's size: one 64-bit word per 64 session indices.
func deniedWords(maxSessions uint32) uint32 {
	return (maxSessions + 63) / 64
}

// mapDenied maps shk_denied; all sets every bit (counters adopted from
// an agent that kept no marker may be nonzero anywhere: each index is then
// read until a new session at it clears its bit).
func (d *Dataplane) mapDenied(all bool) error {
	n := int(d.objs.ShkDenied.MaxEntries()) * 8
	mem, err := unix.Mmap(d.objs.ShkDenied.FD(), 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map shk_denied: %w", err)
	}
	d.denied.mu.Lock()
	d.denied.mem = mem
	d.denied.mu.Unlock()
	if all {
		for i := uint32(0); i < d.objs.ShkDenied.MaxEntries(); i++ {
			atomic.StoreUint64(d.deniedWord(i), ^uint64(0))
		}
	}
	return nil
}

// unmapDenied undoes mapDenied (nothing when it did not map).
func (d *Dataplane) unmapDenied() error {
	d.denied.mu.Lock()
	defer d.denied.mu.Unlock()
	if d.denied.mem == nil {
		return nil
	}
	err := unix.Munmap(d.denied.mem)
	d.denied.mem = nil
	if err != nil {
		return fmt.Errorf("unmap shk_denied: %w", err)
	}
	return nil
}

// deniedWord is word i of the mapping; d.denied.mu held, mem mapped.
func (d *Dataplane) deniedWord(i uint32) *uint64 {
	return (*uint64)(unsafe.Pointer(&d.denied.mem[i*8]))
}

// errDeniedUnmapped: the dataplane is closed.
var errDeniedUnmapped = errors.New("denied marker not mapped (dataplane closed)")

// markDenied sets index's bit (user space counting a denial itself).
func (d *Dataplane) markDenied(index uint32) {
	d.denied.mu.RLock()
	defer d.denied.mu.RUnlock()
	if d.denied.mem == nil || index >= d.cfg.MaxSessions {
		return
	}
	atomic.OrUint64(d.deniedWord(index/64), 1<<(index%64))
}

// clearDenied clears index's bit (its counters were just zeroed for a
// new session).
func (d *Dataplane) clearDenied(index uint32) error {
	d.denied.mu.RLock()
	defer d.denied.mu.RUnlock()
	if d.denied.mem == nil {
		return errDeniedUnmapped
	}
	atomic.AndUint64(d.deniedWord(index/64), ^(uint64(1) << (index % 64)))
	return nil
}

// deniedOf says, for each of indices (each below MaxSessions), whether
// its bit is set.
func (d *Dataplane) deniedOf(indices []uint32) ([]bool, error) {
	d.denied.mu.RLock()
	defer d.denied.mu.RUnlock()
	if d.denied.mem == nil {
		return nil, errDeniedUnmapped
	}
	out := make([]bool, len(indices))
	var w uint64
	cur := ^uint32(0)
	for i, idx := range indices {
		if idx/64 != cur {
			cur = idx / 64
			w = atomic.LoadUint64(d.deniedWord(cur))
		}
		out[i] = w&(1<<(idx%64)) != 0
	}
	return out, nil
}
