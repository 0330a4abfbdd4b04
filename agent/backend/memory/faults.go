package memory

import "fmt"

// Op names a call that fault injection can target.
type Op string

// The calls FailNext can fail (and, for Apply and Release, CrashAfter can
// crash inside).
const (
	OpCreateSession  Op = "CreateSession"
	OpDestroySession Op = "DestroySession"
	OpNewHandle      Op = "NewHandle" // NewHandle and NewOnceHandle
	OpApply          Op = "Apply"
	OpRelease        Op = "Release"
	OpRevoke         Op = "Revoke"
	OpSnapshot       Op = "Snapshot"
)

// fault is what is armed for one Op.
type fault struct {
	failIn int   // calls until the failing one (1: the next); 0: none
	err    error // what it fails with
	crash  *crash
}

// crash is a panic armed inside an Apply or Release: after k entries.
type crash struct {
	k int
	v any
}

// FailNext makes the nth next call of op (n = 1: the very next) fail with
// an error wrapping err, before that call changes anything; the calls
// before and after it run normally. A call counts once its arguments have
// passed validation. n < 1 disarms op's failure.
func (b *Backend) FailNext(op Op, n int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.faultFor(op)
	f.failIn, f.err = max(n, 0), err
}

// CrashAfter makes the next call of op (OpApply or OpRelease) panic with v
// once k of its entries are applied or released: k = 0 before the first,
// k at least the number of entries after the last (for Release, before
// the slot is freed). What was done stays done, as a backend that died
// inside the call would leave it, and the panic unwinds with the backend's
// lock released, so a test can recover it and carry on with the same
// backend (a new agent opening on it reconciles). A call that fails
// earlier, or an Apply of an empty Delta, leaves the crash armed.
func (b *Backend) CrashAfter(op Op, k int, v any) {
	if op != OpApply && op != OpRelease {
		panic(fmt.Sprintf("memory: CrashAfter(%s): only Apply and Release apply entries", op))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.faultFor(op).crash = &crash{k: max(k, 0), v: v}
}

// ClearFaults disarms every failure and crash.
func (b *Backend) ClearFaults() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.faults = map[Op]*fault{}
}

func (b *Backend) faultFor(op Op) *fault {
	f := b.faults[op]
	if f == nil {
		f = &fault{}
		b.faults[op] = f
	}
	return f
}

// fault counts one call of op and returns the injected error if this is
// the failing one; b.mu held.
func (b *Backend) fault(op Op) error {
	f := b.faults[op]
	if f == nil || f.failIn == 0 {
		return nil
	}
	if f.failIn--; f.failIn > 0 {
		return nil
	}
	return fmt.Errorf("memory backend: injected failure of %s: %w", op, f.err)
}

// crashPlan takes the crash armed for op, for a call of n entries (nil:
// none); b.mu held.
func (b *Backend) crashPlan(op Op, n int) *crash {
	f := b.faults[op]
	if f == nil || f.crash == nil {
		return nil
	}
	c := f.crash
	f.crash = nil
	c.k = min(c.k, n)
	return c
}

// at panics when i entries are done and the crash is due there.
func (c *crash) at(i int) {
	if c != nil && i == c.k {
		panic(c.v)
	}
}
