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
	var k4 shkShkNever4Key
	var stale4 []shkShkNever4Key
	it := d.objs.ShkNever4.Iterate()
	for it.Next(&k4, new(uint32)) {
		if !want4[k4] {
			stale4 = append(stale4, k4)
		}
	}
	var k6 shkShkNever6Key
	var stale6 []shkShkNever6Key
	it6 := d.objs.ShkNever6.Iterate()
	for it6.Next(&k6, new(uint32)) {
		if !want6[k6] {
			stale6 = append(stale6, k6)
		}
	}
	for _, k := range stale4 {
		d.objs.ShkNever4.Delete(k)
	}
	for _, k := range stale6 {
		d.objs.ShkNever6.Delete(k)
	}
	return nil
}

// ensureNeverDefaults adds backend.DefaultNeverList to what the maps hold
// (an adopted list keeps the daemon's listeners).
func (d *Dataplane) ensureNeverDefaults() error {
	one := uint32(1)
	for _, n := range backend.DefaultNeverList {
		p := n.Prefix.Masked()
		port := n.Port<<8 | n.Port>>8
		var err error
		if p.Addr().Is4() {
			err = d.objs.ShkNever4.Update(shkShkNever4Key{Prefixlen: uint32(16 + p.Bits()), Port: port, Addr: p.Addr().As4()}, one, ebpf.UpdateAny)
		} else {
			err = d.objs.ShkNever6.Update(shkShkNever6Key{Prefixlen: uint32(16 + p.Bits()), Port: port, Addr: p.Addr().As16()}, one, ebpf.UpdateAny)
		}
		if err != nil {
			return fmt.Errorf("never-list: %w", err)
		}
	}
	return nil
}
