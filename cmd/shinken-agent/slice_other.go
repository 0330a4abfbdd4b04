//go:build !linux

package main

import "errors"

// defaultSliceUS is agent_cpu_slice_us's default (Linux only).
const defaultSliceUS = 100

// sliceKeeper: only Linux's EEVDF takes a fair task's slice.
type sliceKeeper struct{ err error }

func newSliceKeeper(us int) *sliceKeeper {
	return &sliceKeeper{err: errors.New("unavailable: a task's scheduler slice is set on Linux only")}
}

func (k *sliceKeeper) keep() {}

func (k *sliceKeeper) fact() string { return "kernel default slice: " + k.err.Error() }
