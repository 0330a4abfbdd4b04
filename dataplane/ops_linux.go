package dataplane

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ---- sessions ----

// registerSession makes the session cgroup and registers it with the kernel:
// one mkdir and one map insert, whatever the number of sessions.
// CreateSession then gives it its boundary.
func (d *Dataplane) registerSession(name string) (Session, error) {
	if err := ValidSessionName(name); err != nil {
		return Session{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.sessions[name]; ok {
		return Session{}, fmt.Errorf("%w: %s", ErrSessionExists, name)
	}
	idx, err := d.indices.take()
	if err != nil {
		return Session{}, err
	}
	path := filepath.Join(d.parent, name)
	if err := os.Mkdir(path, 0o755); err != nil {
		d.indices.put(idx)
		if errors.Is(err, fs.ErrExist) {
			return Session{}, fmt.Errorf("%w: cgroup %s exists", ErrSessionExists, path)
		}
		return Session{}, fmt.Errorf("create session cgroup: %w", err)
	}
	id, err := cgroupID(path)
	if err == nil {
		err = d.zeroCounters(idx)
	}
	if err == nil {
		err = d.objs.ShkSessions.Update(id, shkShkSession{Index: idx}, ebpf.UpdateNoExist)
		if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) {
			err = fmt.Errorf("%w: sessions (%d)", ErrMapFull, d.cfg.MaxSessions)
		}
	}
	if err != nil {
		_ = unix.Rmdir(path)
		d.indices.put(idx)
		return Session{}, fmt.Errorf("register session %s: %w", name, err)
	}
	s := &Session{Name: name, Index: idx, CgroupID: id, Path: path}
	d.sessions[name] = s
	d.byIndex[idx] = s
	d.names.Store(idx, *s)
	d.byName.Store(name, *s)
	return *s, nil
}

func (d *Dataplane) zeroCounters(idx uint32) error {
	zeros := make([]uint64, runtime.NumCPU())
	if n, err := ebpf.PossibleCPU(); err == nil {
		zeros = make([]uint64, n)
	}
	for r := uint32(0); r < NumReasons; r++ {
		if err := d.objs.ShkCounters.Update(idx*NumReasons+r, zeros, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("reset counters: %w", err)
		}
	}
	if err := d.clearDenied(idx); err != nil {
		return fmt.Errorf("reset counters: %w", err)
	}
	return d.zeroBudget(idx)
}

// DestroySession revokes the session's kernel identity first (its processes
// are denied everything from then on, and no lookup reaches its entries),
// kills its processes, removes its cgroup, and then removes its egress
// entries outside the dataplane lock, in batches (purgeEntries): a session
// with many entries never holds up the other sessions' writes.
func (d *Dataplane) DestroySession(name string) error {
	d.mu.Lock()
	s, ok := d.sessions[name]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrSessionNotFound, name)
	}
	if err := d.objs.ShkSessions.Delete(s.CgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		d.mu.Unlock()
		return fmt.Errorf("unregister session %s: %w", name, err)
	}
	delete(d.sessions, name)
	delete(d.byIndex, s.Index)
	d.names.Delete(s.Index)
	d.byName.Delete(name)
	// (Stale file entries of this index would come back with its next
	// session: a failure keeps the index, as a stale egress entry does.)
	neverErr := errors.Join(d.dropSessionNeverOKs(s.Index), d.storeFiles(s.Index, d.files[name], true), d.storeWorkspace(s.Index, nil), d.dropProcessLocked(name, s.Index), d.dropFSLSM(s.Index))
	delete(d.files, name)
	delete(d.workspaces, name)
	// The entries leave the index now (no write or lookup of this index
	// sees them); the index itself is handed out again only once they are
	// gone from the kernel and nothing of the session runs.
	set := d.prefixes[s.Index]
	delete(d.prefixes, s.Index)
	delete(d.cover, s.Index)
	delete(d.exp.due, s.Index)
	killErr := killCgroup(d.cfg.CgroupRoot, s.Path)
	d.releaseBoundary(name)
	d.mu.Unlock()
	// After the kill: no hook of the session runs any more to make the
	// entry again (a socket released later finds none and counts nothing).
	neverErr = errors.Join(neverErr, d.dropQuota(s.CgroupID))

	if err := errors.Join(neverErr, d.purgeEntries(s.Index, set)); err != nil {
		// The index keeps stale entries: never hand it out again in this
		// process (reconcile purges them on the next start).
		return errors.Join(fmt.Errorf("purge egress entries of %s: %w", name, err), killErr)
	}
	if killErr == nil {
		d.mu.Lock()
		d.indices.put(s.Index)
		d.mu.Unlock()
	}
	return killErr
}

// purgeBatch is how many entries purgeEntries deletes between two short
// holds of d.mu (which only adjust the occupancy counts).
const purgeBatch = 1024

// purgeEntries deletes the kernel entries of a session already taken out of
// the index; d.mu not held. It returns the first errors met.
func (d *Dataplane) purgeEntries(idx uint32, set map[netip.Prefix]struct{}) error {
	var errs []error
	batch := make([]netip.Prefix, 0, purgeBatch)
	flush := func() {
		d.mu.Lock()
		for _, p := range batch {
			d.countPrefix(p, -1)
		}
		d.mu.Unlock()
		batch = batch[:0]
	}
	for p := range set {
		if err := d.deleteEntry(idx, p); err != nil {
			if len(errs) < 8 {
				errs = append(errs, err)
			}
			continue
		}
		if batch = append(batch, p); len(batch) == purgeBatch {
			flush()
		}
	}
	flush()
	return errors.Join(errs...)
}

// Session returns the session called name.
func (d *Dataplane) Session(name string) (Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[name]
	if !ok {
		return Session{}, fmt.Errorf("%w: %s", ErrSessionNotFound, name)
	}
	return *s, nil
}

// Sessions lists the sessions.
func (d *Dataplane) Sessions() ([]Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Session, 0, len(d.sessions))
	for _, s := range d.sessions {
		out = append(out, *s)
	}
	return out, nil
}

// ---- handles ----

// NewHandle issues a live handle. A non-zero parent must be live; the child
// can then never outlive it, because the kernel checks every ancestor.
func (d *Dataplane) NewHandle(parent HandleRef, expires time.Time) (HandleRef, error) {
	return d.newHandle(parent, expires, HandleLive)
}

// NewOnceHandle issues an approve-once handle: the first connect or
// unconnected send the egress map allows under it moves it to HandleUsed
// with a compare-and-swap in the kernel (bpf/handle.bpf.h); a second one
// gets EPERM with no round trip to user space.
func (d *Dataplane) NewOnceHandle(parent HandleRef, expires time.Time) (HandleRef, error) {
	return d.newHandle(parent, expires, HandleOnce)
}

func (d *Dataplane) newHandle(parent HandleRef, expires time.Time, state HandleState) (HandleRef, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var v shkShkHandle
	if !parent.IsZero() {
		depth, err := d.chainDepth(parent)
		if err != nil {
			return HandleRef{}, err
		}
		if depth >= MaxChain {
			return HandleRef{}, fmt.Errorf("%w: parent %s is %d deep (max %d)", ErrChainTooDeep, parent, depth, MaxChain)
		}
		v.Parent = parent.Slot
		v.ParentGeneration = parent.Generation
	}
	slot, err := d.slots.take()
	if err != nil {
		return HandleRef{}, err
	}
	gen := d.handleGen[slot] + 1
	if gen == 0 {
		gen = 1
	}
	v.State = uint32(state)
	v.Generation = gen
	v.ExpiresNs = bootNs(expires)
	if err := d.objs.ShkHandles.Update(slot, v, ebpf.UpdateAny); err != nil {
		d.slots.put(slot)
		return HandleRef{}, fmt.Errorf("issue handle: %w", err)
	}
	d.handleGen[slot] = gen
	d.handleUp[slot] = HandleRef{Slot: v.Parent, Generation: v.ParentGeneration}
	ref := HandleRef{Slot: slot, Generation: gen}
	d.watchDeadline(ref, expires)
	return ref, nil
}

// chainDepth checks that ref and all its ancestors are live and returns how
// many handles the chain holds.
func (d *Dataplane) chainDepth(ref HandleRef) (int, error) {
	for depth := 1; depth <= MaxChain+1; depth++ {
		h, err := d.readHandle(ref)
		if err != nil {
			return 0, err
		}
		if !HandleState(h.State).Alive() {
			return 0, fmt.Errorf("%w: %s is %s", ErrHandleNotLive, ref, HandleState(h.State))
		}
		if h.ExpiresNs != 0 && h.ExpiresNs <= bootNow() {
			return 0, fmt.Errorf("%w: %s expired", ErrHandleNotLive, ref)
		}
		if h.Parent == 0 {
			return depth, nil
		}
		ref = HandleRef{Slot: h.Parent, Generation: h.ParentGeneration}
	}
	return 0, fmt.Errorf("%w: chain longer than %d", ErrChainTooDeep, MaxChain)
}

func (d *Dataplane) readHandle(ref HandleRef) (shkShkHandle, error) {
	var h shkShkHandle
	if ref.Slot == 0 || ref.Slot >= d.cfg.MaxHandles {
		return h, fmt.Errorf("%w: %s", ErrInvalidHandle, ref)
	}
	if err := d.objs.ShkHandles.Lookup(ref.Slot, &h); err != nil {
		return h, fmt.Errorf("read handle %s: %w", ref, err)
	}
	if h.Generation != ref.Generation || h.State == uint32(HandleFree) {
		return h, fmt.Errorf("%w: %s (slot is at generation %d, %s)", ErrHandleNotLive, ref, h.Generation, HandleState(h.State))
	}
	return h, nil
}

// Revoke kills ref and, through the kernel's parent walk, every handle
// attenuated from it: one map write of the handle's slot, after which every
// new connect and send under it fails. In sweep mode Revoke then destroys the
// session sockets whose peers no live grant covers any more, before it
// returns, and follow-up sweeps run over the next second, on the sweeper's
// one goroutine, shared by every revoke of a burst (followUpSweeps).
// Revoking a handle that is already revoked, freed or recycled is a no-op.
func (d *Dataplane) Revoke(ref HandleRef) error { return d.RevokeThen(ref, nil) }

// RevokeThen is Revoke, calling written (when not nil) the moment the map
// write has returned, before open flows are cut: for measuring how soon the
// kernel enforces a revoke.
func (d *Dataplane) RevokeThen(ref HandleRef, written func()) error {
	wrote, flows, err := d.revoke(ref)
	if err != nil {
		return err
	}
	if written != nil {
		written()
	}
	if !wrote {
		// Already dead: the revoke that killed it cut its flows.
		return nil
	}
	// The write above already fails every new connect; now cut the flows
	// that are open (sweep mode), unless no flow check ever tried a rule
	// under the handle or a descendant (flowmark_linux.go).
	if !flows && marksOrdered() {
		d.skipSweep()
	} else if err := d.cutFlows(); err != nil {
		return fmt.Errorf("revoke %s: handle revoked, but cutting open flows failed: %w", ref, err)
	}
	// And what the dead handles opened in the sessions' views goes (the
	// views of the sessions holding such an entry: reach_linux.go).
	if err := d.fileSweep(ref); err != nil {
		return fmt.Errorf("revoke %s: handle revoked, but changing the file views failed: %w", ref, err)
	}
	// And the gated sessions' allowlists and bounds lose what it gave
	// (those holding an entry under it).
	if err := d.procSweep(ref); err != nil {
		return fmt.Errorf("revoke %s: handle revoked, but changing the exec gates failed: %w", ref, err)
	}
	return nil
}

// revoke flips ref's state word to revoked and says whether it wrote and
// whether a flow may be open under ref (flowmark_linux.go).
func (d *Dataplane) revoke(ref HandleRef) (wrote, flows bool, _ error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, err := d.readHandle(ref)
	if errors.Is(err, ErrHandleNotLive) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	if h.State == uint32(HandleRevoked) {
		return false, false, nil
	}
	if flows, err = d.revokeWord(ref); err != nil {
		return false, false, err
	}
	d.ops.revokeWrites.Add(1)
	// An exception shared with other grants must not die with this one:
	// point it at a handle still live (the rules leave with Release).
	if err := d.repointNeverOKs(ref); err != nil {
		return true, flows, fmt.Errorf("revoke %s: handle revoked, but a shared never-list exception kept pointing at it: %w", ref, err)
	}
	return true, flows, nil
}

// FreeHandle returns a revoked handle's slot for reuse. The next handle
// issued in the slot has a new generation, so entries and sockets that still
// name ref stay dead.
func (d *Dataplane) FreeHandle(ref HandleRef) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, err := d.readHandle(ref)
	if err != nil {
		return err
	}
	if h.State != uint32(HandleRevoked) {
		return fmt.Errorf("%w: free %s: revoke it first", ErrInvalidHandle, ref)
	}
	return d.freeLocked(ref)
}

// freeLocked returns ref's slot to the pool; d.mu is held.
func (d *Dataplane) freeLocked(ref HandleRef) error {
	h := shkShkHandle{State: uint32(HandleFree), Generation: ref.Generation}
	if err := d.objs.ShkHandles.Update(ref.Slot, h, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("free %s: %w", ref, err)
	}
	d.slots.put(ref.Slot)
	return nil
}

// HandleState reads one handle's state word: HandleUsed for an approve-once
// handle the kernel consumed; HandleFree for a freed or recycled slot.
func (d *Dataplane) HandleState(ref HandleRef) (HandleState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, err := d.readHandle(ref)
	if errors.Is(err, ErrHandleNotLive) {
		return HandleFree, nil
	}
	if err != nil {
		return HandleFree, err
	}
	return HandleState(h.State), nil
}

// Handles lists every handle slot that is live or revoked.
func (d *Dataplane) Handles() ([]Handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Handle
	err := eachArray(d.objs.ShkHandles, func(key uint32, h *shkShkHandle) {
		if h.State == uint32(HandleFree) {
			return
		}
		hd := Handle{Ref: HandleRef{Slot: key, Generation: h.Generation}, State: HandleState(h.State), Expires: bootToTime(h.ExpiresNs)}
		if h.Parent != 0 {
			hd.Parent = HandleRef{Slot: h.Parent, Generation: h.ParentGeneration}
		}
		out = append(out, hd)
	})
	if err != nil {
		return nil, fmt.Errorf("read handles: %w", err)
	}
	return out, nil
}

// ---- counters ----

// Counters returns the session's denial counts by reason, summed over CPUs.
// Index 0 of the kernel table ("no session") is read with index 0.
func (d *Dataplane) Counters(index uint32) (Denials, error) {
	var out Denials
	if index >= d.cfg.MaxSessions {
		return out, fmt.Errorf("%w: index %d", ErrSessionNotFound, index)
	}
	var per []uint64
	for r := uint32(0); r < NumReasons; r++ {
		if err := d.objs.ShkCounters.Lookup(index*NumReasons+r, &per); err != nil {
			return out, fmt.Errorf("read counters: %w", err)
		}
		for _, v := range per {
			out[r] += v
		}
	}
	return out, nil
}

// RingbufDrops is the number of denial events the ring buffer had no room for
// (the counters still counted them), the exec gate's dropped reports
// included.
func (d *Dataplane) RingbufDrops() (uint64, error) {
	var per []uint64
	if err := d.objs.ShkStats.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read stats: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n + d.execEv.drops.Load(), nil
}

// ---- clocks ----

// The kernel compares deadlines with bpf_ktime_get_boot_ns (CLOCK_BOOTTIME).

func bootNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint64(ts.Nano())
}

// bootNs converts a wall-clock deadline to CLOCK_BOOTTIME nanoseconds; zero
// stays zero ("never") and a deadline in the past becomes 1 (already passed).
func bootNs(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	now := bootNow()
	d := time.Until(t)
	if d <= 0 {
		return 1
	}
	return now + uint64(d)
}

func bootToTime(ns uint64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Now().Add(time.Duration(int64(ns) - int64(bootNow())))
}

// ---- DNS ----

// DNSBase is the first address of the per-session resolver addresses: the
// kernel sends a session's DNS queries to DNSBase + session index.
var DNSBase = netip.AddrFrom4([4]byte{127, 128, 0, 0})

// SessionDNSAddr is the loopback address session index's DNS queries are
// redirected to.
func SessionDNSAddr(index uint32) netip.Addr {
	b := DNSBase.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += index
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// SetDNSRedirect makes the kernel send every UDP and TCP query a session
// makes to port 53, whatever the address, to the resolver listening on
// 0.0.0.0:port (it sees the session's own address as destination). Port 0
// turns redirection off: DNS is then ordinary egress, denied unless allowed.
func (d *Dataplane) SetDNSRedirect(port uint16) error {
	if err := d.objs.ShkSettings.Update(uint32(0), shkShkConfig{DnsPort: port}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("configure DNS redirect: %w", err)
	}
	return nil
}

// DNSRedirect returns the resolver port DNS is redirected to (0: off).
func (d *Dataplane) DNSRedirect() (uint16, error) {
	var c shkShkConfig
	if err := d.objs.ShkSettings.Lookup(uint32(0), &c); err != nil {
		return 0, fmt.Errorf("read config: %w", err)
	}
	return c.DnsPort, nil
}

// SessionByIndex returns the session with kernel index idx.
func (d *Dataplane) SessionByIndex(idx uint32) (Session, error) {
	// Without d.mu: the resolver asks for every query and the agent for
	// every kernel denial event; neither waits behind another session's
	// writes (names changes under d.mu, with byIndex).
	s, ok := d.names.Load(idx)
	if !ok {
		return Session{}, fmt.Errorf("%w: index %d", ErrSessionNotFound, idx)
	}
	return s.(Session), nil
}

// Occupancy reports the entries in use and the capacity of the sessions,
// handles and egress maps (prefix tries and exact-address hashes), from the
// dataplane's own indexes (no map walk).
func (d *Dataplane) Occupancy() []Occupancy {
	d.mu.Lock()
	defer d.mu.Unlock()
	handles := d.slots.inUse()
	return []Occupancy{
		{Map: "sessions", Entries: len(d.sessions), Limit: int(d.cfg.MaxSessions) - 1},
		{Map: "handles", Entries: handles, Limit: int(d.cfg.MaxHandles) - 1},
		{Map: "egress4", Entries: d.nEntries[0], Limit: int(d.cfg.MaxEgress4)},
		{Map: "exact4", Entries: d.nEntries[1], Limit: int(d.cfg.MaxEgress4)},
		{Map: "egress6", Entries: d.nEntries[2], Limit: int(d.cfg.MaxEgress6)},
		{Map: "exact6", Entries: d.nEntries[3], Limit: int(d.cfg.MaxEgress6)},
	}
}
