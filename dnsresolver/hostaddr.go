package dnsresolver

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// HostAddrs is the set of the host's own addresses, which answers never
// carry unless the session's policy names the address (see Grant): a
// session shares the host's network namespace, so an allowed name that
// resolves to one of them would open every service the host listens to on
// all addresses. Linux keeps it current with WatchHostAddrs (netlink address
// updates); a daemon may also feed it with Set, Add and Remove. Its methods
// are safe for concurrent use; a nil *HostAddrs holds nothing.
type HostAddrs struct {
	mu       sync.Mutex
	set      atomic.Pointer[map[netip.Addr]struct{}]
	gen      atomic.Uint64 // bumped with every change: prepared replies depend on the set
	onChange []func([]netip.Addr)
}

// NewHostAddrs returns a set holding addrs.
func NewHostAddrs(addrs ...netip.Addr) *HostAddrs {
	h := &HostAddrs{}
	h.Set(addrs)
	return h
}

// hostKey is the form addresses are kept in: no IPv4 mapping, no zone.
func hostKey(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// Contains reports whether a is one of the host's addresses.
func (h *HostAddrs) Contains(a netip.Addr) bool {
	if h == nil {
		return false
	}
	m := h.set.Load()
	if m == nil || len(*m) == 0 {
		return false
	}
	_, ok := (*m)[hostKey(a)]
	return ok
}

// Addrs returns the addresses, sorted.
func (h *HostAddrs) Addrs() []netip.Addr {
	if h == nil {
		return nil
	}
	m := h.set.Load()
	if m == nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(*m))
	for a := range *m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Set replaces the whole set.
func (h *HostAddrs) Set(addrs []netip.Addr) {
	m := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			m[hostKey(a)] = struct{}{}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if old := h.set.Load(); old != nil && maps.Equal(*old, m) {
		return
	}
	h.storeLocked(m)
}

// Add adds one address.
func (h *HostAddrs) Add(a netip.Addr) { h.change(a, true) }

// Remove removes one address.
func (h *HostAddrs) Remove(a netip.Addr) { h.change(a, false) }

func (h *HostAddrs) change(a netip.Addr, add bool) {
	if !a.IsValid() {
		return
	}
	a = hostKey(a)
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.set.Load()
	var m map[netip.Addr]struct{}
	if old != nil {
		if _, ok := (*old)[a]; ok == add {
			return
		}
		m = make(map[netip.Addr]struct{}, len(*old)+1)
		for k := range *old {
			m[k] = struct{}{}
		}
	} else {
		if !add {
			return
		}
		m = map[netip.Addr]struct{}{}
	}
	if add {
		m[a] = struct{}{}
	} else {
		delete(m, a)
	}
	h.storeLocked(m)
}

func (h *HostAddrs) storeLocked(m map[netip.Addr]struct{}) {
	h.set.Store(&m)
	h.gen.Add(1)
	if len(h.onChange) > 0 {
		addrs := h.Addrs()
		for _, f := range h.onChange {
			f(addrs)
		}
	}
}

// OnChange calls f with the whole set, sorted, after every change (with h's
// lock held: keep it quick, and do not call h's methods that change it).
// A daemon can feed the kernel's never-list from it.
func (h *HostAddrs) OnChange(f func(addrs []netip.Addr)) {
	h.mu.Lock()
	h.onChange = append(h.onChange, f)
	h.mu.Unlock()
}

// generation changes whenever the set does; 0 for a nil set.
func (h *HostAddrs) generation() uint64 {
	if h == nil {
		return 0
	}
	return h.gen.Load()
}

// namesHost reports whether g names the host address a: one of its
// AllowNonPublic prefixes is exactly a (a /32 or a /128). A wider prefix
// holding a does not: the policy must name the host's address itself.
func (g *compiledGrant) namesHost(a netip.Addr) bool {
	a = hostKey(a)
	for _, p := range g.AllowNonPublic {
		if p.Bits() == a.BitLen() && p.Addr() == a {
			return true
		}
	}
	return false
}
