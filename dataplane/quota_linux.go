package dataplane

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The per-session socket and port-hold counts (bpf/quota.bpf.h): the kernel
// makes a session's entry with its first socket and keeps it current; user
// space only reads it and deletes it with the session.

// SocketUse is what one session holds of the host's shared socket resources.
type SocketUse struct {
	Sockets int32 // inet sockets it created and has not released
	Ports   int32 // port holds of its sockets (sweep mode)
}

// SocketUse reads the counts of a session (zero before its first socket).
func (d *Dataplane) SocketUse(session string) (SocketUse, error) {
	s, err := d.Session(session)
	if err != nil {
		return SocketUse{}, err
	}
	var q shkShkQuota
	if err := d.objs.ShkQuotas.Lookup(s.CgroupID, &q); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return SocketUse{}, nil
		}
		return SocketUse{}, fmt.Errorf("read socket use of %s: %w", session, err)
	}
	return SocketUse{Sockets: q.Socks, Ports: q.Ports}, nil
}

// dropQuota deletes the counts of a session cgroup gone.
func (d *Dataplane) dropQuota(cgid uint64) error {
	if err := d.objs.ShkQuotas.Delete(cgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("drop socket counts of cgroup %d: %w", cgid, err)
	}
	return nil
}

// pruneQuotas deletes the counts of every cgroup that is no session any
// more (sessions removed while no agent ran); d.sessions is current.
func (d *Dataplane) pruneQuotas() error {
	live := map[uint64]bool{}
	for _, s := range d.sessions {
		live[s.CgroupID] = true
	}
	var (
		cgid  uint64
		q     shkShkQuota
		stale []uint64
	)
	it := d.objs.ShkQuotas.Iterate()
	for it.Next(&cgid, &q) {
		if !live[cgid] {
			stale = append(stale, cgid)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read socket counts: %w", err)
	}
	for _, id := range stale {
		if err := d.dropQuota(id); err != nil {
			return err
		}
	}
	return nil
}
