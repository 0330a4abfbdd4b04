package memory

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// AllowEgress adds one rule to the session's table. A rule already there
// (backend.SameRule) only has its expiry extended, never shortened. On
// error the table is unchanged.
func (b *Backend) AllowEgress(name string, r backend.EgressRule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.allow(name, r)
}

// allow is AllowEgress; b.mu held.
func (b *Backend) allow(name string, r backend.EgressRule) error {
	s, ok := b.sessions[name]
	if !ok {
		return fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	if r.NeverOK && (r.Prefix.Bits() != r.Prefix.Addr().BitLen() || r.Ports.Lo != r.Ports.Hi) {
		return fmt.Errorf("%w: a never-list exception names one address and one port (or every port): %s", backend.ErrInvalidPrefix, r)
	}
	if _, err := b.chainDepth(r.Handle); err != nil {
		return err
	}
	if err := b.insert(s, r); err != nil {
		return err
	}
	if r.NeverOK {
		b.addNeverOK(neverKeyOf(s.Index, r), r.Handle)
	}
	return nil
}

// insert writes r into s's table; b.mu held.
func (b *Backend) insert(s *session, r backend.EgressRule) error {
	p := r.Prefix
	if e, ok := s.entries[p]; ok {
		for i, o := range e.rules {
			if backend.SameRule(o, r) {
				// A refresh keeps the later expiry; zero is "never".
				if o.Expires.IsZero() || (!r.Expires.IsZero() && !r.Expires.After(o.Expires)) {
					return nil
				}
				e.rules[i].Expires = r.Expires
				return nil
			}
		}
		if len(e.rules) >= MaxRules {
			return fmt.Errorf("%w: %s already holds %d rules for session %s", backend.ErrRulesFull, p, MaxRules, s.Name)
		}
		if !r.Expires.IsZero() && !e.expiring() {
			if err := b.dnsEntryCap(s, p); err != nil {
				return err
			}
		}
		e.rules = append(e.rules, r)
		return nil
	}
	if !r.Expires.IsZero() {
		if err := b.dnsEntryCap(s, p); err != nil {
			return err
		}
	}
	if err := checkCover(s.entries, p); err != nil {
		return err
	}
	if t := tableOf(p); b.nEntries[t] >= b.tableLimit(t) {
		return fmt.Errorf("%w: egress entries (IPv4 %d, IPv6 %d)", backend.ErrMapFull, b.cfg.MaxEgress4, b.cfg.MaxEgress6)
	}
	s.entries[p] = &entry{rules: []backend.EgressRule{r}}
	b.countEntry(p, 1)
	return nil
}

// remove takes one rule out of s's table (ErrRuleNotFound if absent); the
// entry goes with its last rule; b.mu held.
func (b *Backend) remove(s *session, r backend.EgressRule) error {
	if e, ok := s.entries[r.Prefix]; ok {
		for i, o := range e.rules {
			if !backend.SameRule(o, r) {
				continue
			}
			if r.NeverOK {
				b.dropNeverOK(neverKeyOf(s.Index, r), r.Handle)
			}
			e.rules = slices.Delete(e.rules, i, i+1)
			if len(e.rules) == 0 {
				delete(s.entries, r.Prefix)
				b.countEntry(r.Prefix, -1)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %s in session %s", backend.ErrRuleNotFound, r, s.Name)
}

// removeFrom is RemoveEgress: one rule out of the named session's table;
// b.mu held.
func (b *Backend) removeFrom(name string, r backend.EgressRule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	s, ok := b.sessions[name]
	if !ok {
		return fmt.Errorf("%w: %s", backend.ErrSessionNotFound, name)
	}
	return b.remove(s, r)
}

// Apply pushes a grant's Delta as the Linux backend does: the Delta's shape
// is checked, then its rules are added in order (egress, then inbound);
// when one fails, the rules added so far are removed again, last first,
// and the error says what failed (and what the undo could not remove).
func (b *Backend) Apply(name string, d backend.Delta) error {
	if err := d.Validate(); err != nil {
		return err
	}
	rules := d.AddressRules()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fault(OpApply); err != nil {
		return err
	}
	// The files section is checked first and added last, in one step
	// that cannot fail (the Linux backend derives the view once from all
	// of it, after the address rules).
	if err := b.checkFiles(name, d.Files); err != nil {
		return err
	}
	if err := b.checkProcess(name, d.Process); err != nil {
		return err
	}
	if len(rules) == 0 {
		if len(d.Files) > 0 {
			b.sessions[name].addFiles(d.Files)
		}
		if len(d.Process) > 0 {
			b.sessions[name].addProcess(d.Process)
		}
		return nil
	}
	crash := b.crashPlan(OpApply, len(rules))
	var added []backend.EgressRule
	for i, r := range rules {
		crash.at(i)
		had := b.has(name, r)
		if err := b.allow(name, r); err != nil {
			var errs []error
			for k := len(added) - 1; k >= 0; k-- {
				errs = append(errs, b.removeFrom(name, added[k]))
			}
			if uerr := errors.Join(errs...); uerr != nil {
				return fmt.Errorf("%w (undo incomplete: %v)", err, uerr)
			}
			return err
		}
		if !had {
			added = append(added, r)
		}
	}
	crash.at(len(rules))
	if len(d.Files) > 0 {
		b.sessions[name].addFiles(d.Files)
	}
	if len(d.Process) > 0 {
		b.sessions[name].addProcess(d.Process)
	}
	return nil
}

// has reports whether session name holds r already; b.mu held.
func (b *Backend) has(name string, r backend.EgressRule) bool {
	s, ok := b.sessions[name]
	if !ok {
		return false
	}
	e, ok := s.entries[r.Prefix]
	return ok && slices.ContainsFunc(e.rules, func(o backend.EgressRule) bool { return backend.SameRule(o, r) })
}

// Snapshot reads the sessions (by index), the handle table (by slot) and
// every session's rules (by prefix, then in entry order), in one pass.
func (b *Backend) Snapshot() (backend.Snapshot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fault(OpSnapshot); err != nil {
		return backend.Snapshot{}, err
	}
	snap := backend.Snapshot{Sessions: b.sessionsLocked(), Handles: b.handlesLocked(), Deltas: map[string]backend.Delta{}}
	for _, s := range b.sessions {
		rs := s.rules()
		if len(rs) > 0 || len(s.files) > 0 || len(s.process) > 0 {
			d := backend.DeltaOf(rs)
			d.Files = slices.Clone(s.files)
			d.Process = slices.Clone(s.process)
			snap.Deltas[s.Name] = d
		}
	}
	return snap, nil
}

// rules lists s's rules by prefix, then in entry order.
func (s *session) rules() []backend.EgressRule {
	var out []backend.EgressRule
	for _, p := range slices.SortedFunc(maps.Keys(s.entries), comparePrefix) {
		out = append(out, s.entries[p].rules...)
	}
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// checkCover refuses p when some address would then be covered by more of
// the session's prefixes than a lookup visits (MaxCover).
func checkCover(set map[netip.Prefix]*entry, p netip.Prefix) error {
	above := 0
	for bits := p.Bits() - 1; bits >= 0; bits-- {
		q, _ := p.Addr().Prefix(bits)
		if _, ok := set[q]; ok {
			above++
		}
	}
	if above+1 > MaxCover {
		return fmt.Errorf("%w: %s would sit below %d other prefixes (max %d in a chain)", backend.ErrCoverTooDeep, p, above, MaxCover)
	}
	for q := range set {
		if q.Bits() <= p.Bits() || !p.Contains(q.Addr()) || q.Addr().Is4() != p.Addr().Is4() {
			continue
		}
		depth := 1
		for bits := q.Bits() - 1; bits >= 0; bits-- {
			a, _ := q.Addr().Prefix(bits)
			if _, ok := set[a]; ok {
				depth++
			}
		}
		if depth+1 > MaxCover {
			return fmt.Errorf("%w: %s would put %s below %d prefixes (max %d)", backend.ErrCoverTooDeep, p, q, depth, MaxCover)
		}
	}
	return nil
}

// tableOf is the kernel table p lives in: 0 egress4 (trie), 1 exact4,
// 2 egress6, 3 exact6.
func tableOf(p netip.Prefix) int {
	t := 0
	if !p.Addr().Is4() {
		t = 2
	}
	if p.Bits() == p.Addr().BitLen() {
		t++
	}
	return t
}

func (b *Backend) tableLimit(t int) int {
	if t < 2 {
		return b.cfg.MaxEgress4
	}
	return b.cfg.MaxEgress6
}

func (b *Backend) countEntry(p netip.Prefix, n int) { b.nEntries[tableOf(p)] += n }

// ---- the never-list ----

// SetNeverList replaces the never-list: destinations Connect refuses before
// any grant is consulted, unless an admin-named exception of the session
// (a NeverOK rule) covers them. New starts with backend.DefaultNeverList.
func (b *Backend) SetNeverList(entries []backend.NeverEntry) error {
	out := make([]backend.NeverEntry, 0, len(entries))
	for _, n := range entries {
		p := n.Prefix.Masked()
		if !p.IsValid() {
			return fmt.Errorf("%w: never-list %s", backend.ErrInvalidPrefix, n)
		}
		e := backend.NeverEntry{Prefix: p, Port: n.Port}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.never = out
	return nil
}

// NeverList returns the never-list in force.
func (b *Backend) NeverList() []backend.NeverEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.never)
}

// neverKey names one admin-named exception: session, address, port (0:
// every port), as the kernel's shk_never_oks key.
type neverKey struct {
	session uint32
	addr    netip.Addr
	port    uint16
}

func neverKeyOf(session uint32, r backend.EgressRule) neverKey {
	return neverKey{session: session, addr: r.Prefix.Addr().Unmap(), port: r.Ports.Lo}
}

// neverOK is one exception: every handle whose NeverOK rule names it, each
// with its chain (itself, then its ancestors, as they stood when it named
// the exception), and the one handle the exception points at (the kernel
// checks that one only). As in the Linux backend, the exception points at
// the best of its handles (live before approve-once before spent before
// dead), re-chosen when a handle names or stops naming it, and when a
// handle of one of its chains is revoked.
type neverOK struct {
	refs   []backend.HandleRef
	chains map[backend.HandleRef][]backend.HandleRef
	cur    backend.HandleRef
}

func (n *neverOK) unname(h backend.HandleRef) {
	n.refs = slices.DeleteFunc(n.refs, func(r backend.HandleRef) bool { return r == h })
	delete(n.chains, h)
}

// addNeverOK records that h names k and re-points k; b.mu held.
func (b *Backend) addNeverOK(k neverKey, h backend.HandleRef) {
	n := b.neverOKs[k]
	if n == nil {
		n = &neverOK{chains: map[backend.HandleRef][]backend.HandleRef{}}
		b.neverOKs[k] = n
	}
	if !slices.Contains(n.refs, h) {
		n.refs = append(n.refs, h)
		n.chains[h] = b.handleChain(h)
	}
	b.pointNeverOK(n)
}

// dropNeverOK forgets that h names k: the exception goes with its last
// handle, or is re-pointed; b.mu held.
func (b *Backend) dropNeverOK(k neverKey, h backend.HandleRef) {
	n := b.neverOKs[k]
	if n == nil {
		return
	}
	n.unname(h)
	if len(n.refs) == 0 {
		delete(b.neverOKs, k)
		return
	}
	b.pointNeverOK(n)
}

// repointNeverOKs re-points, after ref's revoke, the exceptions another
// handle still names whose chains hold ref; b.mu held.
func (b *Backend) repointNeverOKs(ref backend.HandleRef) {
	for _, n := range b.neverOKs {
		if len(n.refs) < 2 {
			continue
		}
		for _, c := range n.chains {
			if slices.Contains(c, ref) {
				b.pointNeverOK(n)
				break
			}
		}
	}
}

// pointNeverOK points n at the first of its best handles; b.mu held.
func (b *Backend) pointNeverOK(n *neverOK) {
	best, rank := n.refs[len(n.refs)-1], -1
	for _, r := range n.refs {
		if k := b.neverRank(r); k > rank {
			best, rank = r, k
		}
	}
	n.cur = best
}

// neverRank orders the handles an exception may point at: live (3),
// approve-once not used yet (2), spent (1), dead (0); b.mu held.
func (b *Backend) neverRank(r backend.HandleRef) int {
	h, err := b.readHandle(r)
	if err != nil || b.ancestorRevoked(h) {
		return 0
	}
	switch h.state {
	case backend.HandleLive:
		return 3
	case backend.HandleOnce:
		return 2
	case backend.HandleUsed:
		return 1
	}
	return 0
}

// expiring reports whether the entry holds a rule with an expiry (a
// DNS-derived entry).
func (e *entry) expiring() bool {
	for _, r := range e.rules {
		if !r.Expires.IsZero() {
			return true
		}
	}
	return false
}

// dnsEntryCap refuses a new DNS-derived entry p of s past
// Config.MaxDNSEntries, after dropping the session's rules past their
// expiry (what the Linux backend's collector does within a second); b.mu
// held.
func (b *Backend) dnsEntryCap(s *session, p netip.Prefix) error {
	count := func() int {
		n := 0
		for _, e := range s.entries {
			if e.expiring() {
				n++
			}
		}
		return n
	}
	if count() < b.cfg.MaxDNSEntries {
		return nil
	}
	for _, e := range s.entries {
		for _, r := range slices.Clone(e.rules) {
			if b.expired(r.Expires) {
				b.remove(s, r)
			}
		}
	}
	if n := count(); n >= b.cfg.MaxDNSEntries {
		return fmt.Errorf("%w: session %s holds %d DNS-derived entries (max %d); %s not added", backend.ErrEntryCap, s.Name, n, b.cfg.MaxDNSEntries, p)
	}
	return nil
}
