package dataplane

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// countersBatchMax bounds the counter slots one BPF_MAP_LOOKUP_BATCH call
// reads (and so the buffers it needs: 4 bytes of key and 8 bytes per
// possible CPU of value per slot).
const countersBatchMax = 1 << 15

// CountersOf reads the denial counters of the sessions at indices (as
// Counters does, one result per index, in order) with one
// BPF_MAP_LOOKUP_BATCH call per run of consecutive indices (at most
// countersBatchMax slots a call) instead of NumReasons lookups per session:
// at 100,000 sessions a scrape makes a handful of syscalls, not 1,200,000.
// An index past the table is an error, as in Counters.
func (d *Dataplane) CountersOf(indices []uint32) ([]Denials, error) {
	out := make([]Denials, len(indices))
	if len(indices) == 0 {
		return out, nil
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	order := make([]int, len(indices))
	for i := range order {
		order[i] = i
		if indices[i] >= d.cfg.MaxSessions {
			return nil, fmt.Errorf("%w: index %d", ErrSessionNotFound, indices[i])
		}
	}
	slices.SortFunc(order, func(a, b int) int { return int(indices[a]) - int(indices[b]) })
	perCall := countersBatchMax / NumReasons // sessions a call
	keys := make([]uint32, perCall*NumReasons)
	vals := make([]uint64, perCall*NumReasons*ncpu)
	for i := 0; i < len(order); {
		// A run of consecutive indices (a repeated index reads once).
		lo := indices[order[i]]
		j := i + 1
		for j < len(order) && indices[order[j]] <= indices[order[j-1]]+1 && indices[order[j]]-lo < uint32(perCall) {
			j++
		}
		hi := indices[order[j-1]]
		n := (hi - lo + 1) * NumReasons
		if err := d.lookupCounters(lo*NumReasons, n, keys, vals); err != nil {
			return nil, err
		}
		for _, k := range order[i:j] {
			base := int(indices[k]-lo) * NumReasons
			for r := 0; r < NumReasons; r++ {
				for c := 0; c < ncpu; c++ {
					out[k][r] += vals[(base+r)*ncpu+c]
				}
			}
		}
		i = j
	}
	return out, nil
}

// lookupCounters reads n consecutive slots of shk_counters from slot first
// into vals (ncpu values a slot) with BPF_MAP_LOOKUP_BATCH. For an array
// the kernel starts after the key in in_batch, so slot first is read by
// passing first-1 (or no in_batch at all for slot 0).
func (d *Dataplane) lookupCounters(first, n uint32, keys []uint32, vals []uint64) error {
	prev := first - 1
	var out uint32
	attr := struct {
		inBatch, outBatch, keys, values uint64
		count, mapFD                    uint32
		elemFlags, flags                uint64
	}{
		outBatch: uint64(uintptr(unsafe.Pointer(&out))),
		keys:     uint64(uintptr(unsafe.Pointer(&keys[0]))),
		values:   uint64(uintptr(unsafe.Pointer(&vals[0]))),
		count:    n,
		mapFD:    uint32(d.objs.ShkCounters.FD()),
	}
	if first > 0 {
		attr.inBatch = uint64(uintptr(unsafe.Pointer(&prev)))
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_LOOKUP_BATCH, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(&prev)
	runtime.KeepAlive(&out)
	// ENOENT: the table ended within the batch (the last index's slots
	// are the table's last); count then says how many were read.
	if errno != 0 && errno != unix.ENOENT {
		return fmt.Errorf("read counters (batch of %d from %d): %w", n, first, errno)
	}
	if attr.count != n {
		return fmt.Errorf("read counters (batch of %d from %d): %d read", n, first, attr.count)
	}
	for i := uint32(0); i < n; i++ {
		if keys[i] != first+i {
			return fmt.Errorf("read counters: slot %d came back as %d", first+i, keys[i])
		}
	}
	return nil
}
