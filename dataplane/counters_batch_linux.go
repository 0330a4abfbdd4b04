package dataplane

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// countersBatchMax bounds the counter slots one BPF_MAP_LOOKUP_BATCH call
// reads (and so the buffers it needs: 4 bytes of key and 8 bytes per
// possible CPU of value per slot).
const countersBatchMax = 1 << 15

// runGap is the most unmarked indices between two marked ones that
// CountersOf reads through (NumReasons slots each, discarded) to keep them
// in one batch call: BenchmarkCountersOf measured a session's slots at
// about 2 µs of copy on 2 CPUs, and a batch call of one session at about
// 7 µs (loaded host), so a gap of two is read through, a wider one not.
const runGap = 2

// CountersOf reads the denial counters of the sessions at indices (as
// Counters does, one result per index, in order) with one
// BPF_MAP_LOOKUP_BATCH call per run of consecutive indices (at most
// countersBatchMax slots a call) instead of NumReasons lookups per session:
// at 100,000 sessions a scrape makes about 40 syscalls, not 1,200,000,
// spread over GOMAXPROCS goroutines. Only indices whose denied marker is
// set are read (denied_linux.go): the others' counters are all zero, and
// are given as zero without a read.
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
	for _, idx := range indices {
		if idx >= d.cfg.MaxSessions {
			return nil, fmt.Errorf("%w: index %d", ErrSessionNotFound, idx)
		}
	}
	marked, err := d.deniedOf(indices)
	if err != nil {
		return nil, err
	}
	order := make([]int, 0, len(indices))
	for i := range indices {
		if marked[i] {
			order = append(order, i)
		}
	}
	if len(order) == 0 {
		return out, nil
	}
	slices.SortFunc(order, func(a, b int) int { return int(indices[a]) - int(indices[b]) })
	// Runs of near indices (a repeated index reads once; a gap of at most
	// runGap unmarked indices is read through rather than cost another
	// call), each at most perCall sessions: one batch call each.
	perCall := countersBatchMax / NumReasons
	type run struct{ i, j int } // order[i:j]
	var runs []run
	for i := 0; i < len(order); {
		lo := indices[order[i]]
		j := i + 1
		for j < len(order) && indices[order[j]] <= indices[order[j-1]]+1+runGap && indices[order[j]]-lo < uint32(perCall) {
			j++
		}
		runs = append(runs, run{i, j})
		i = j
	}
	// The batches are spread over up to GOMAXPROCS goroutines: the kernel
	// copies slot by slot, so at 100,000 sessions (1,200,000 slots) the
	// copy, not the syscalls, is the time.
	workers := min(runtime.GOMAXPROCS(0), len(runs))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := make([]uint32, perCall*NumReasons)
			vals := make([]uint64, perCall*NumReasons*ncpu)
			for ri := w; ri < len(runs); ri += workers {
				r := runs[ri]
				lo, hi := indices[order[r.i]], indices[order[r.j-1]]
				if err := d.lookupCounters(lo*NumReasons, (hi-lo+1)*NumReasons, keys, vals); err != nil {
					errs[w] = err
					return
				}
				for _, k := range order[r.i:r.j] {
					base := int(indices[k]-lo) * NumReasons
					for c := 0; c < NumReasons; c++ {
						for p := 0; p < ncpu; p++ {
							out[k][c] += vals[(base+c)*ncpu+p]
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
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
