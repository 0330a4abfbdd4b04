package capability

// Decision layer: containment. Within is the exact, field-by-field check that a
// capability conveys nothing its bound does not (the manifest check and
// attenuation), with the path, domain and prefix covering rules it uses.

import (
	"fmt"
	"net/netip"
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
// the attenuation and the manifest check: exact, field by field (each
// class's own check is its spec's within).
func (c Capability) Within(bound Capability) error {
	if c.Class != bound.Class {
		return fmt.Errorf("%w: class %s is not %s", ErrWidens, c.Class, bound.Class)
	}
	s := specOf(c.Class)
	if s == nil {
		return nil
	}
	c, bound = c.Normalized(), bound.Normalized()
	widen := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s %s", ErrWidens, c.Class, fmt.Sprintf(format, a...))
	}
	return s.within(c, bound, widen)
}
