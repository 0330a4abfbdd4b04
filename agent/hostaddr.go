package agent

// The host's own addresses are never-listed for sessions: a session shares
// the host's network namespace, so a wide grant (0.0.0.0/0) would otherwise
// reach every service the host listens to on all addresses. The daemon
// feeds the set (SetHostAddrs, from the resolver's netlink address watcher,
// dnsresolver.WatchHostAddrs) and keeps it current as addresses come and go.
//
// The exception rule: a grant rule that names a host address exactly (a /32
// or a /128, with one port or every port: the shape of every never-list
// exception, which the kernel keys by address and port) reaches it, with no
// admin policy needed, unless the address is never-listed for another reason
// too (the default list, Config.NeverList, the daemon's own listeners):
// then the admin permit of neverOK is needed as before. A wider prefix
// holding the address, or a range of ports, does not reach it. Loopback
// addresses are no host addresses here (sessions reach loopback through
// loopback grants; the agent's own loopback listeners are never-listed by
// port already), nor is the unspecified address.

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// SetHostAddrs makes addrs the host's addresses on the never-list (each as
// one /32 or /128, every port), replacing the last set, and re-derives the
// exceptions of every live grant (a grant naming an address that became a
// host address gets its exception, one naming an address that went loses
// it). Invalid, loopback and unspecified addresses are left out.
func (a *Agent) SetHostAddrs(addrs []netip.Addr) error {
	var entries []backend.NeverEntry
	for _, ip := range addrs {
		ip = ip.Unmap().WithZone("")
		if !ip.IsValid() || ip.IsLoopback() || ip.IsUnspecified() {
			continue
		}
		entries = append(entries, backend.NeverEntry{Prefix: netip.PrefixFrom(ip, ip.BitLen())})
	}
	slices.SortFunc(entries, func(x, y backend.NeverEntry) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
	entries = slices.CompactFunc(entries, func(x, y backend.NeverEntry) bool { return x.Prefix == y.Prefix })
	a.mu.Lock()
	defer a.unlock()
	old := a.hostNever
	a.hostNever = entries
	if err := a.setNeverLocked(a.neverExtra); err != nil {
		a.hostNever = old
		return fmt.Errorf("host addresses: %w", err)
	}
	return a.rederiveNever()
}

// hostAddrOK says whether rule r reaches its never-listed destination as a
// host address named exactly: r's address is a host address and no other
// never-list entry covers what r would open there (for a rule of every
// port, no entry on the address at any port: the kernel's exception of
// every port would lift that entry too, such as the agent's own listener
// on all addresses); a.mu held. r has the exception shape already (neverOK
// checks it).
func (a *Agent) hostAddrOK(r backend.EgressRule) bool {
	if !neverListed(a.hostNever, r) {
		return false
	}
	ip := r.Prefix.Addr()
	for _, list := range [][]backend.NeverEntry{backend.DefaultNeverList, a.cfg.NeverList, a.neverExtra} {
		for _, n := range list {
			if n.Prefix.Contains(ip) && (n.Port == 0 || r.Ports.IsAny() || n.Port == r.Ports.Lo) {
				return false
			}
		}
	}
	return true
}
