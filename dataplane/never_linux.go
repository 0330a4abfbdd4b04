package dataplane

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/shinken-agent/shinken/agent/backend"
)

// SetNeverList replaces the never-list (shk_never4|6): destinations the
// connect and send hooks refuse before any grant is consulted, unless the
// allowing rule is NeverOK. Open installs backend.DefaultNeverList.
func (d *Dataplane) SetNeverList(entries []NeverEntry) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.setNeverList(entries)
}

func (d *Dataplane) setNeverList(entries []NeverEntry) error {
	want4 := map[shkShkNever4Key]bool{}
	want6 := map[shkShkNever6Key]bool{}
	for _, n := range entries {
		p := n.Prefix.Masked()
		if !p.IsValid() {
			return fmt.Errorf("%w: never-list %s", ErrInvalidPrefix, n)
		}
		port := n.Port<<8 | n.Port>>8 // network order in the key
		if p.Addr().Is4() {
			want4[shkShkNever4Key{Prefixlen: uint32(16 + p.Bits()), Port: port, Addr: p.Addr().As4()}] = true
		} else {
			want6[shkShkNever6Key{Prefixlen: uint32(16 + p.Bits()), Port: port, Addr: p.Addr().As16()}] = true
		}
	}
	cur4, cur6, err := d.neverKeys()
	if err != nil {
		return err
	}
	// The hint first covers what is listed and what comes, so that no
	// lookup is skipped that an entry could answer (never_hint_linux.go).
	if err := d.writeNeverHint(union(cur4, want4), union(cur6, want6)); err != nil {
		return err
	}
	one := uint32(1)
	for k := range want4 {
		if err := d.objs.ShkNever4.Update(k, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("never-list: %w", err)
		}
	}
	for k := range want6 {
		if err := d.objs.ShkNever6.Update(k, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("never-list: %w", err)
		}
	}
	// then drop what is no longer listed (adding first: never a gap)
	for k := range cur4 {
		if !want4[k] {
			d.objs.ShkNever4.Delete(k)
		}
	}
	for k := range cur6 {
		if !want6[k] {
			d.objs.ShkNever6.Delete(k)
		}
	}
	// and the hint narrows to what is listed now.
	return d.writeNeverHint(want4, want6)
}

// ensureNeverDefaults adds backend.DefaultNeverList to what the maps hold
// (an adopted list keeps the daemon's listeners).
func (d *Dataplane) ensureNeverDefaults() error {
	cur4, cur6, err := d.neverKeys()
	if err != nil {
		return err
	}
	add4 := map[shkShkNever4Key]bool{}
	add6 := map[shkShkNever6Key]bool{}
	for _, n := range backend.DefaultNeverList {
		p := n.Prefix.Masked()
		port := n.Port<<8 | n.Port>>8
		if p.Addr().Is4() {
			add4[shkShkNever4Key{Prefixlen: uint32(16 + p.Bits()), Port: port, Addr: p.Addr().As4()}] = true
		} else {
			add6[shkShkNever6Key{Prefixlen: uint32(16 + p.Bits()), Port: port, Addr: p.Addr().As16()}] = true
		}
	}
	// The hint (this load's map starts all zero: every lookup made)
	// covers the adopted entries and the defaults before they go in.
	if err := d.writeNeverHint(union(cur4, add4), union(cur6, add6)); err != nil {
		return err
	}
	one := uint32(1)
	for k := range add4 {
		if err := d.objs.ShkNever4.Update(k, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("never-list: %w", err)
		}
	}
	for k := range add6 {
		if err := d.objs.ShkNever6.Update(k, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("never-list: %w", err)
		}
	}
	return nil
}
