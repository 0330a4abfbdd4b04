package dataplane

import "fmt"

// idPool hands out small dense ids (session indices, handle slots) from 1
// up to a limit, reusing returned ones first. Not safe for concurrent use;
// the Dataplane's mutex guards it.
type idPool struct {
	what  string   // for errors: "sessions", "handles"
	limit uint32   // ids are < limit
	next  uint32   // lowest never-issued id
	free  []uint32 // returned ids (stack)
}

func newIDPool(what string, limit uint32) idPool {
	return idPool{what: what, limit: limit, next: 1}
}

func (p *idPool) take() (uint32, error) {
	if n := len(p.free); n > 0 {
		id := p.free[n-1]
		p.free = p.free[:n-1]
		return id, nil
	}
	if p.next >= p.limit {
		return 0, fmt.Errorf("%w: %s (%d)", ErrMapFull, p.what, p.limit)
	}
	p.next++
	return p.next - 1, nil
}

func (p *idPool) put(id uint32) { p.free = append(p.free, id) }

// rebuild sets the pool from the ids in use: the next id follows the
// highest, and every lower id not in use is free.
func (p *idPool) rebuild(used func(id uint32) bool, highest uint32) {
	p.next = highest + 1
	p.free = p.free[:0]
	for id := highest; id >= 1; id-- {
		if !used(id) {
			p.free = append(p.free, id)
		}
	}
}

// inUse is the number of ids issued and not returned.
func (p *idPool) inUse() int { return int(p.next) - 1 - len(p.free) }
