package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Egress: the per-session allowlist entries (LPM tries and exact-address
// hashes, IPv4 and IPv6) that the connect and sendmsg hooks consult. Every
// rule carries the caretaker handle it lives under.

// AllowEgress adds rule to the session's egress map. Adding a rule that is
// already there (same prefix, protocol, ports and handle) only extends its
// expiry (never shortens it). On error the maps are unchanged.
func (d *Dataplane) AllowEgress(session string, rule EgressRule) error {
	_, err := d.allowEgress(session, rule)
	return err
}

// allowEgress is AllowEgress; added says whether the rule is new (false:
// it was there, and at most its expiry moved).
func (d *Dataplane) allowEgress(session string, rule EgressRule) (added bool, err error) {
	if err := rule.Validate(); err != nil {
		return false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[session]
	if !ok {
		return false, fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	if rule.NeverOK && (rule.Prefix.Bits() != rule.Prefix.Addr().BitLen() || rule.Ports.Lo != rule.Ports.Hi) {
		return false, fmt.Errorf("%w: a never-list exception names one address and one port (or every port): %s", ErrInvalidPrefix, rule)
	}
	if _, err := d.chainDepth(rule.Handle); err != nil {
		return false, err
	}
	if added, err = d.allowLocked(s, rule); err != nil {
		return false, err
	}
	if rule.NeverOK {
		if err := d.addNeverOK(neverOKKey(s.Index, rule), rule.Handle); err != nil {
			if added {
				// Take the entry back: the call fails as a whole.
				if rerr := d.removeLocked(s, rule); rerr != nil {
					return false, fmt.Errorf("never-list exception %s: %w (undo: %v)", rule, err, rerr)
				}
			}
			return false, fmt.Errorf("never-list exception %s: %w", rule, err)
		}
	}
	return added, nil
}

// neverOKKey is the shk_never_oks key of an admin-named exception.
func neverOKKey(session uint32, r EgressRule) shkShkNeverOkKey {
	a := r.Prefix.Addr().Unmap()
	k := shkShkNeverOkKey{Session: session, Port: r.Ports.Lo<<8 | r.Ports.Lo>>8}
	b := a.AsSlice()
	if a.Is4() {
		k.Family = 2 // AF_INET
	} else {
		k.Family = 10 // AF_INET6
	}
	for i := 0; i < len(b)/4; i++ {
		k.Addr[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24 // network order in memory
	}
	return k
}

// allowLocked is AllowEgress's map write; d.mu held.
func (d *Dataplane) allowLocked(s *Session, rule EgressRule) (added bool, err error) {
	p := rule.Prefix
	val, exists, err := d.lookupEntry(s.Index, p)
	if err != nil {
		return false, err
	}
	r := encodeRule(rule)
	if exists {
		for i := uint32(0); i < val.Nrules; i++ {
			o := val.Rules[i]
			if sameRule(o, r) {
				// A refresh keeps the later expiry: two names may resolve
				// to one address with different TTLs. Zero is "never".
				if o.ExpiresNs == 0 || (r.ExpiresNs != 0 && r.ExpiresNs <= o.ExpiresNs) {
					return false, nil
				}
				val.Rules[i].ExpiresNs = r.ExpiresNs
				if err := d.writeEntry(s.Index, p, &val, ebpf.UpdateExist); err != nil {
					return false, err
				}
				d.scheduleExpiry(s.Index, p, r.ExpiresNs)
				return false, nil
			}
		}
		if val.Nrules >= MaxRules {
			return false, fmt.Errorf("%w: %s already holds %d rules for session %s", ErrRulesFull, p, MaxRules, s.Name)
		}
		if r.ExpiresNs != 0 {
			if err := d.dnsEntryCap(s, p); err != nil {
				return false, err
			}
		}
		val.Rules[val.Nrules] = r
		val.Nrules++
		if err := d.writeEntry(s.Index, p, &val, ebpf.UpdateExist); err != nil {
			return false, err
		}
		d.scheduleExpiry(s.Index, p, r.ExpiresNs)
		return true, nil
	}
	if r.ExpiresNs != 0 {
		if err := d.dnsEntryCap(s, p); err != nil {
			return false, err
		}
	}
	if c := d.cover[s.Index]; c != nil {
		if err := c.check(p); err != nil {
			return false, err
		}
	}
	val = shkShkEgressValue{Prefixlen: uint32(p.Bits()), Nrules: 1}
	val.Rules[0] = r
	if err := d.writeEntry(s.Index, p, &val, ebpf.UpdateNoExist); err != nil {
		return false, err
	}
	d.indexPrefix(s.Index, p)
	d.scheduleExpiry(s.Index, p, r.ExpiresNs)
	return true, nil
}

// RemoveEgress removes one rule; the entry goes when its last rule does.
func (d *Dataplane) RemoveEgress(session string, rule EgressRule) error {
	if err := rule.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[session]
	if !ok {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	return d.removeLocked(s, rule)
}

// removeLocked is RemoveEgress's map write; d.mu held.
func (d *Dataplane) removeLocked(s *Session, rule EgressRule) error {
	val, exists, err := d.lookupEntry(s.Index, rule.Prefix)
	if err != nil {
		return err
	}
	r := encodeRule(rule)
	if exists {
		for i := uint32(0); i < val.Nrules; i++ {
			o := val.Rules[i]
			if !sameRule(o, r) {
				continue
			}
			if rule.NeverOK {
				if err := d.dropNeverOK(neverOKKey(s.Index, rule), rule.Handle); err != nil {
					return fmt.Errorf("never-list exception %s: %w", rule, err)
				}
			}
			if val.Nrules == 1 {
				if err := d.deleteEntry(s.Index, rule.Prefix); err != nil {
					return err
				}
				d.unindexPrefix(s.Index, rule.Prefix)
				return nil
			}
			copy(val.Rules[i:], val.Rules[i+1:val.Nrules])
			val.Nrules--
			val.Rules[val.Nrules] = shkShkRule{}
			return d.writeEntry(s.Index, rule.Prefix, &val, ebpf.UpdateExist)
		}
	}
	return fmt.Errorf("%w: %s in session %s", ErrRuleNotFound, rule, s.Name)
}

// EgressRules lists the session's rules.
func (d *Dataplane) EgressRules(session string) ([]EgressRule, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sessions[session]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrSessionNotFound, session)
	}
	var out []EgressRule
	for p := range d.prefixes[s.Index] {
		val, exists, err := d.lookupEntry(s.Index, p)
		if err != nil {
			return nil, err
		}
		if !exists {
			continue
		}
		for i := uint32(0); i < val.Nrules && i < MaxRules; i++ {
			out = append(out, decodeRule(p, val.Rules[i]))
		}
	}
	return out, nil
}

// sameRule reports whether two rules are the same grant of the same
// protocol and ports (their expiries may differ).
func sameRule(a, b shkShkRule) bool {
	return a.Handle == b.Handle && a.Generation == b.Generation && a.Proto == b.Proto && a.PortLo == b.PortLo && a.PortHi == b.PortHi && a.Flags == b.Flags
}

func encodeRule(r EgressRule) shkShkRule {
	return shkShkRule{
		Handle:     r.Handle.Slot,
		Generation: r.Handle.Generation,
		ExpiresNs:  bootNs(r.Expires),
		PortLo:     r.Ports.Lo,
		PortHi:     r.Ports.Hi,
		Proto:      uint8(r.Proto),
		Flags:      boolFlag(r.NeverOK, ruleNeverOK) | boolFlag(r.Inbound, ruleInbound),
	}
}

// ruleNeverOK and ruleInbound are SHK_RULE_NEVER_OK and SHK_RULE_INBOUND
// (bpf/shinken_api.bpf.h).
const (
	ruleNeverOK = 1
	ruleInbound = 2
)

func boolFlag(on bool, f uint8) uint8 {
	if on {
		return f
	}
	return 0
}

// entryMap is the map that holds p: the exact-address hash for a /32 or
// /128, the trie otherwise.
func (d *Dataplane) entryMap(p netip.Prefix) *ebpf.Map {
	exact := p.Bits() == p.Addr().BitLen()
	switch {
	case p.Addr().Is4() && exact:
		return d.objs.ShkExact4
	case p.Addr().Is4():
		return d.objs.ShkEgress4
	case exact:
		return d.objs.ShkExact6
	}
	return d.objs.ShkEgress6
}

func entryKey(session uint32, p netip.Prefix) any {
	if p.Addr().Is4() {
		k := key4(session, p)
		return &k
	}
	k := key6(session, p)
	return &k
}

func (d *Dataplane) lookupEntry(session uint32, p netip.Prefix) (shkShkEgressValue, bool, error) {
	var val shkShkEgressValue
	// A trie lookup returns the longest match, not the exact one: the
	// entry's own prefix length is checked below.
	err := d.entryMap(p).Lookup(entryKey(session, p), &val)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return shkShkEgressValue{}, false, nil
	}
	if err != nil {
		return val, false, fmt.Errorf("read egress entry %s: %w", p, err)
	}
	if int(val.Prefixlen) != p.Bits() {
		return shkShkEgressValue{}, false, nil
	}
	if _, ok := d.prefixes[session][p]; !ok {
		return shkShkEgressValue{}, false, nil
	}
	return val, true, nil
}

func (d *Dataplane) writeEntry(session uint32, p netip.Prefix, val *shkShkEgressValue, flags ebpf.MapUpdateFlags) error {
	err := d.entryMap(p).Update(entryKey(session, p), val, flags)
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("%w: egress entries (IPv4 %d, IPv6 %d)", ErrMapFull, d.cfg.MaxEgress4, d.cfg.MaxEgress6)
	}
	if err != nil {
		return fmt.Errorf("write egress entry %s: %w", p, err)
	}
	return nil
}

func (d *Dataplane) deleteEntry(session uint32, p netip.Prefix) error {
	err := d.entryMap(p).Delete(entryKey(session, p))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete egress entry %s: %w", p, err)
	}
	return nil
}

func key4(session uint32, p netip.Prefix) shkShkEgress4Key {
	return shkShkEgress4Key{Prefixlen: uint32(32 + p.Bits()), Session: session, Addr: p.Addr().As4()}
}

func key6(session uint32, p netip.Prefix) shkShkEgress6Key {
	return shkShkEgress6Key{Prefixlen: uint32(32 + p.Bits()), Session: session, Addr: p.Addr().As16()}
}
