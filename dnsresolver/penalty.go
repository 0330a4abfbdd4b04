package dnsresolver

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The penalty box: a session that sends more than twice its query rate
// within one second (Config.QueryRate queries over the rate) is flooding.
// It goes into the box, where its queries over the rate are dropped without
// a reply (before, they are answered REFUSED), and on Linux the kernel steers
// its UDP queries to a socket and worker of their own (reuseport_linux.go),
// so a flood fills that socket's queue and no other session's, and drops
// those over its rate before the worker reads them (steer_linux.go). It leaves
// the box penaltyHold after its last query over the rate. The box holds at
// most maxPenalised sessions; a flooder beyond that stays where it was,
// still limited by its bucket.
const (
	penaltyHold   = 5 * time.Second
	maxPenalised  = 64
	sweepInterval = 500 * time.Millisecond
)

type penaltyBox struct {
	mu  sync.Mutex
	set atomic.Pointer[map[uint32]int64] // index -> Unix ns it entered; read without the lock
	// steer, when set (the UDP sockets, on Linux), is told the box's
	// members whenever they change.
	steer func([]uint32)
}

func (p *penaltyBox) has(idx uint32) bool {
	m := p.set.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[idx]
	return ok
}

// add puts idx in the box; false when it is full.
func (p *penaltyBox) add(idx uint32, now int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.set.Load()
	if old != nil {
		if _, ok := (*old)[idx]; ok {
			return true
		}
		if len(*old) >= maxPenalised {
			return false
		}
	}
	m := map[uint32]int64{idx: now}
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	p.set.Store(&m)
	p.steerLocked(m)
	return true
}

// expire takes out of the box every session whose last query over the
// rate is older than penaltyHold.
func (p *penaltyBox) expire(l *limits, now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.set.Load()
	if old == nil {
		return
	}
	m := map[uint32]int64{}
	for k, v := range *old {
		if now-l.session(k).excess.Load() <= int64(penaltyHold) {
			m[k] = v
		}
	}
	if len(m) != len(*old) {
		p.set.Store(&m)
		p.steerLocked(m)
	}
}

func (p *penaltyBox) steerLocked(m map[uint32]int64) {
	if p.steer == nil {
		return
	}
	idx := make([]uint32, 0, len(m))
	for k := range m {
		idx = append(idx, k)
	}
	slices.Sort(idx)
	p.steer(idx)
}

// Penalised returns the session indices in the penalty box now.
func (r *Resolver) Penalised() []uint32 {
	m := r.box.set.Load()
	if m == nil {
		return nil
	}
	out := make([]uint32, 0, len(*m))
	for k := range *m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (r *Resolver) penalised(idx uint32) bool { return r.box.has(idx) }

// overRate records a query over the rate of the session at idx, and puts the
// session in the penalty box once QueryRate of them came within a second.
func (r *Resolver) overRate(s *sessionLimit, idx uint32, now int64) {
	s.excess.Store(now)
	if start := s.window.Load(); now-start >= int64(time.Second) {
		if s.window.CompareAndSwap(start, now) {
			s.inWindow.Store(0)
		}
	}
	if n := s.inWindow.Add(1); n >= uint64(max(r.cfg.QueryRate, 1)) && !r.box.has(idx) {
		if r.box.add(idx, now) {
			r.log.Warn("dns session floods: in the penalty box", "index", idx, "over_rate_in_a_second", n)
		}
	}
}

// maintain sweeps the buckets and the penalty box until Close.
func (r *Resolver) maintain() {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
			ns := r.cfg.now().UnixNano()
			r.countKernelDrops(ns)
			r.box.expire(r.limits, ns)
			r.limits.sweep(ns, penaltyHold)
		}
	}
}

// countKernelDrops counts the queries the steering program dropped since the
// last call (steer_linux.go): a session whose queries the kernel still drops
// is still flooding, and stays in the box.
func (r *Resolver) countKernelDrops(now int64) {
	if r.udp == nil {
		return
	}
	for idx, n := range r.udp.kernelDrops() {
		r.limits.session(idx).excess.Store(now)
		var sc *counters
		if name, ok := r.cfg.SessionName(idx); ok {
			sc = r.stats.session(name)
		}
		both(&r.stats.total, sc, func(c *counters) { c.kernelDropped.Add(n) })
	}
}
