package capability

// Decision layer: containment. Within is the exact, field-by-field check that a
// capability conveys nothing its bound does not (the manifest check and
// attenuation), with the path, domain and prefix covering rules it uses.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// pathUnder reports whether p equals root or lies below it.
func pathUnder(p, root string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}

func underAny(p string, roots []string) bool {
	for _, r := range roots {
		if pathUnder(p, r) {
			return true
		}
	}
	return false
}

// domainCovers reports whether the domain pattern outer matches every name
// the pattern inner matches.
func domainCovers(outer, inner string) bool {
	if outer == inner {
		return true
	}
	innerBase, innerApex := inner, true
	switch {
	case strings.HasPrefix(inner, "**."):
		innerBase = inner[3:]
	case strings.HasPrefix(inner, "*."):
		innerBase, innerApex = inner[2:], false
	}
	switch {
	case strings.HasPrefix(outer, "**."):
		base := outer[3:]
		return innerBase == base || strings.HasSuffix(innerBase, "."+base)
	case strings.HasPrefix(outer, "*."):
		base := outer[2:]
		if strings.HasSuffix(innerBase, "."+base) {
			return true
		}
		return innerBase == base && !innerApex
	}
	return false // outer exact, inner different
}

func prefixCovers(outer, inner netip.Prefix) bool {
	return outer.Addr().Is4() == inner.Addr().Is4() && outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

// Within reports (as an error wrapping ErrWidens, naming the first field that
// escapes) whether every authority c conveys is also conveyed by bound. It is
// the attenuation and the manifest check: exact, field by field.
func (c Capability) Within(bound Capability) error {
	if c.Class != bound.Class {
		return fmt.Errorf("%w: class %s is not %s", ErrWidens, c.Class, bound.Class)
	}
	c, bound = c.Normalized(), bound.Normalized()
	widen := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s %s", ErrWidens, c.Class, fmt.Sprintf(format, a...))
	}
	switch c.Class {
	case ClassNetEgress:
		in, out := c.Egress, bound.Egress
		for _, d := range in.Domains {
			if !slices.ContainsFunc(out.Domains, func(o string) bool { return domainCovers(o, d) }) {
				return widen("domain %q", d)
			}
		}
		for _, p := range in.CIDRs {
			if !slices.ContainsFunc(out.CIDRs, func(o netip.Prefix) bool { return prefixCovers(o, p) }) {
				return widen("cidr %v", p)
			}
		}
		if len(out.Ports) > 0 {
			if len(in.Ports) == 0 && (len(in.Domains) > 0 || len(in.CIDRs) > 0) {
				return widen("ports: any port where the bound allows %v", out.Ports)
			}
			for _, r := range in.Ports {
				if !slices.ContainsFunc(out.Ports, func(o PortRange) bool { return o.Lo <= r.Lo && r.Hi <= o.Hi }) {
					return widen("ports %v", r)
				}
			}
		}
		if out.TLSInspect && !in.TLSInspect {
			return widen("drops tls_inspect")
		}
	case ClassNetInbound:
		in, out := c.Inbound, bound.Inbound
		for _, p := range in.CIDRs {
			if !slices.ContainsFunc(out.CIDRs, func(o netip.Prefix) bool { return prefixCovers(o, p) }) {
				return widen("cidr %v", p)
			}
		}
		if len(out.Ports) > 0 {
			if len(in.Ports) == 0 && len(in.CIDRs) > 0 {
				return widen("ports: any port where the bound allows %v", out.Ports)
			}
			for _, r := range in.Ports {
				if !slices.ContainsFunc(out.Ports, func(o PortRange) bool { return o.Lo <= r.Lo && r.Hi <= o.Hi }) {
					return widen("ports %v", r)
				}
			}
		}
	case ClassFSScope:
		in, out := c.FS, bound.FS
		for _, p := range in.Read {
			if !underAny(p, out.Read) {
				return widen("read %q", p)
			}
		}
		for _, p := range in.Write {
			if !underAny(p, out.Write) {
				return widen("write %q", p)
			}
		}
		for _, d := range out.Deny {
			// Every path the bound denies must stay denied: some deny entry of c
			// must cover it (a bound deny that c's grants cannot reach anyway
			// is harmless, but keeping the rule simple and strict is cheaper
			// than proving that).
			if !slices.ContainsFunc(in.Deny, func(x string) bool { return pathUnder(d, x) }) {
				return widen("drops deny %q", d)
			}
		}
	case ClassClipboard:
		if c.Clipboard.PasteIn && !bound.Clipboard.PasteIn {
			return widen("paste_in")
		}
		if c.Clipboard.CopyOut && !bound.Clipboard.CopyOut {
			return widen("copy_out")
		}
	case ClassGPU:
		for _, id := range c.GPU.DeviceIDs {
			if !slices.Contains(bound.GPU.DeviceIDs, id) {
				return widen("device %q", id)
			}
		}
		if len(c.GPU.DeviceIDs) > 0 && c.GPU.Mode != bound.GPU.Mode {
			return widen("mode %q (bound %q)", c.GPU.Mode, bound.GPU.Mode)
		}
	case ClassInstall:
		rank := map[string]int{"": 0, InstallPkg: 1, InstallAny: 2}
		if rank[c.Install.Scope] > rank[bound.Install.Scope] {
			return widen("scope %q (bound %q)", c.Install.Scope, bound.Install.Scope)
		}
	case ClassPersistence:
		for _, p := range c.Persistence.Paths {
			if !underAny(p, bound.Persistence.Paths) {
				return widen("path %q", p)
			}
		}
		if c.Persistence.SurvivesSession && !bound.Persistence.SurvivesSession {
			return widen("survives_session")
		}
	case ClassCredentials:
		for _, s := range c.Credentials.BrokerScopes {
			if !slices.Contains(bound.Credentials.BrokerScopes, s) {
				return widen("broker scope %q", s)
			}
		}
		if !c.Credentials.NeverRaw {
			return widen("never_raw=false")
		}
	case ClassPeripheral:
		in, out := c.Peripheral, bound.Peripheral
		switch {
		case in.Camera && !out.Camera:
			return widen("camera")
		case in.Mic && !out.Mic:
			return widen("mic")
		case in.InputInject && !out.InputInject:
			return widen("input_inject")
		}
		for _, u := range in.USB {
			if !slices.Contains(out.USB, u) {
				return widen("usb %q", u)
			}
		}
	}
	return nil
}
