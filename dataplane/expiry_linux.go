package dataplane

import (
	"container/heap"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
)

// DNS-derived entries: the entries that hold a rule with an expiry (the
// resolver's answers, written with AllowEgress under the record's TTL;
// grants compile to rules without one). Per session they are capped
// (Config.MaxDNSEntries: a new one past the cap is refused with
// ErrEntryCap, a refresh of one already there is not), and a collector
// removes every rule past its expiry within Config.ExpiryInterval of it,
// in batches of expiryBatch entries per hold of the dataplane lock. The
// kernel already ignores an expired rule; collecting it frees the map
// slot and the session's cap.

// expiryBatch bounds the entries the collector looks at per hold of d.mu
// (each costs one map lookup and at most one write or delete).
const expiryBatch = 128

// dueItem says when the collector next looks at one session entry.
type dueItem struct {
	at      uint64 // boot ns
	session uint32
	p       netip.Prefix
}

type dueHeap []dueItem

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueItem)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// expiring is the collector's state; d.mu guards due and queue.
type expiring struct {
	// due: per session index, its DNS-derived entries and when the
	// collector next looks at each (the earliest expiry of its rules, or
	// earlier). len(due[i]) is what the cap counts.
	due   map[uint32]map[netip.Prefix]uint64
	queue dueHeap // one item per due value set; a stale one (due moved) is skipped
	stop  chan struct{}
	done  chan struct{}
	// collected counts rules removed for their expiry; lockMax is the
	// longest hold of d.mu by one batch, in ns (for tests and status).
	collected, lockMax uint64
	errors             atomic.Uint64 // collector rounds that met an error
}

// dnsEntryCap refuses a new DNS-derived entry p of session s past the cap;
// d.mu held.
func (d *Dataplane) dnsEntryCap(s *Session, p netip.Prefix) error {
	m := d.exp.due[s.Index]
	if _, ok := m[p]; ok || len(m) < int(d.cfg.MaxDNSEntries) {
		return nil
	}
	return fmt.Errorf("%w: session %s holds %d DNS-derived entries (max %d); %s not added", ErrEntryCap, s.Name, len(m), d.cfg.MaxDNSEntries, p)
}

// scheduleExpiry notes that entry p of session idx holds a rule expiring at
// (boot ns); d.mu held.
func (d *Dataplane) scheduleExpiry(idx uint32, p netip.Prefix, at uint64) {
	if at == 0 {
		return
	}
	m := d.exp.due[idx]
	if m == nil {
		m = map[netip.Prefix]uint64{}
		d.exp.due[idx] = m
	}
	if old, ok := m[p]; ok && old <= at {
		return // the collector looks earlier and then reschedules
	}
	m[p] = at
	heap.Push(&d.exp.queue, dueItem{at: at, session: idx, p: p})
}

// dropExpiry forgets entry p of session idx (it is gone); d.mu held.
func (d *Dataplane) dropExpiry(idx uint32, p netip.Prefix) {
	if m := d.exp.due[idx]; m != nil {
		delete(m, p)
		if len(m) == 0 {
			delete(d.exp.due, idx)
		}
	}
}

// earliestExpiry is the earliest non-zero expiry of val's rules (0: none).
func earliestExpiry(val *shkShkEgressValue) uint64 {
	var at uint64
	for i := uint32(0); i < val.Nrules && i < MaxRules; i++ {
		if e := val.Rules[i].ExpiresNs; e != 0 && (at == 0 || e < at) {
			at = e
		}
	}
	return at
}

// DNSEntries reports how many DNS-derived entries session holds.
func (d *Dataplane) DNSEntries(session string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[session]
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	return len(d.exp.due[s.Index]), nil
}

// CollectExpired removes every rule whose expiry is past, in batches (see
// expiryBatch), and returns how many it removed. The collector goroutine
// calls it every Config.ExpiryInterval.
func (d *Dataplane) CollectExpired() (int, error) {
	total := 0
	for {
		n, more, err := d.collectBatch(bootNow())
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

// collectBatch handles at most expiryBatch due entries; more says whether
// others are due.
func (d *Dataplane) collectBatch(now uint64) (removed int, more bool, err error) {
	d.mu.Lock()
	start := time.Now()
	defer func() {
		if ns := uint64(time.Since(start)); ns > d.exp.lockMax {
			d.exp.lockMax = ns
		}
		d.mu.Unlock()
	}()
	var errs []error
	for i := 0; i < expiryBatch; i++ {
		if len(d.exp.queue) == 0 || d.exp.queue[0].at > now {
			return removed, false, errors.Join(errs...)
		}
		it := heap.Pop(&d.exp.queue).(dueItem)
		if at, ok := d.exp.due[it.session][it.p]; !ok || at != it.at {
			continue // stale: the entry went, or is due at another time
		}
		n, err := d.collectEntry(it.session, it.p, now)
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, len(d.exp.queue) > 0 && d.exp.queue[0].at <= now, errors.Join(errs...)
}

// collectEntry removes the expired rules of one entry and reschedules it;
// d.mu held.
func (d *Dataplane) collectEntry(idx uint32, p netip.Prefix, now uint64) (int, error) {
	s := d.byIndex[idx]
	if s == nil {
		d.dropExpiry(idx, p)
		return 0, nil
	}
	val, exists, err := d.lookupEntry(idx, p)
	if err != nil {
		// Look again later rather than spin on it.
		d.exp.due[idx][p] = now + uint64(time.Second)
		heap.Push(&d.exp.queue, dueItem{at: now + uint64(time.Second), session: idx, p: p})
		return 0, err
	}
	if !exists {
		d.dropExpiry(idx, p)
		return 0, nil
	}
	var next uint64
	var expired []EgressRule
	for i := uint32(0); i < val.Nrules && i < MaxRules; i++ {
		r := val.Rules[i]
		switch {
		case r.ExpiresNs == 0:
		case r.ExpiresNs <= now:
			expired = append(expired, decodeRule(p, r))
		case next == 0 || r.ExpiresNs < next:
			next = r.ExpiresNs
		}
	}
	removed := 0
	var errs []error
	for _, r := range expired {
		if err := d.removeLocked(s, r); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	d.exp.collected += uint64(removed)
	if len(errs) > 0 && next == 0 {
		next = now + uint64(time.Second) // retry what failed
	}
	if next != 0 {
		m := d.exp.due[idx]
		if m == nil {
			m = map[netip.Prefix]uint64{}
			d.exp.due[idx] = m
		}
		m[p] = next
		heap.Push(&d.exp.queue, dueItem{at: next, session: idx, p: p})
	} else {
		d.dropExpiry(idx, p) // no expiring rule left: no longer DNS-derived
	}
	return removed, errors.Join(errs...)
}

// decodeRule is the EgressRule of entry p's kernel rule r.
func decodeRule(p netip.Prefix, r shkShkRule) EgressRule {
	return EgressRule{
		Prefix:  p,
		Proto:   Proto(r.Proto),
		Ports:   PortRange{Lo: r.PortLo, Hi: r.PortHi},
		Handle:  HandleRef{Slot: r.Handle, Generation: r.Generation},
		Expires: bootToTime(r.ExpiresNs),
		NeverOK: r.Flags&ruleNeverOK != 0,
		Inbound: r.Flags&ruleInbound != 0,
	}
}

// startExpiry starts the collector goroutine.
func (d *Dataplane) startExpiry() {
	d.exp.stop, d.exp.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(d.exp.done)
		t := time.NewTicker(d.cfg.ExpiryInterval)
		defer t.Stop()
		for {
			select {
			case <-d.exp.stop:
				return
			case <-t.C:
				if _, err := d.CollectExpired(); err != nil {
					d.exp.errors.Add(1) // a failed entry is retried a second later
				}
			}
		}
	}()
}

func (d *Dataplane) stopExpiry() {
	if d.exp.stop != nil {
		close(d.exp.stop)
		<-d.exp.done
		d.exp.stop = nil
	}
}
