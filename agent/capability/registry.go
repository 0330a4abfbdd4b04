package capability

// The class registry: each capability class is one spec, registered by its
// own file (class_<name>.go) the way an image format or a database/sql driver
// registers itself. The grammar's generic functions (Normalized, Validate,
// IsEmpty, Within, Allows, String, Summary, DefaultTier, Ingredients.With, the
// manifest keys, Ops, Compile) look the capability's class up here instead of
// switching on class names.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// spec is one capability class's entry in the registry: its scope (the
// field of Capability it fills), its manifest keys, how it normalizes,
// validates, contains and allows, its default tier, and how it compiles to
// its section of a backend.Delta.
//
// Every function but fill and has is called on a capability of the class
// whose scope is set (fill has run); those marked "normalized" get
// Normalized's output. A nil optional function means the class has nothing
// of that kind.
type spec struct {
	class Class
	// keys are the manifest keys, in the order String renders them.
	keys []key
	// ops are the use-time ops (UseRequest.Op) of the class.
	ops []string
	// escalate: kernel denials of the class exist, so a manifest may name
	// it in an "escalate <class>" line.
	escalate bool

	// fill sets the class's scope field to its zero scope when nil; has
	// reports whether the field is set.
	fill func(c *Capability)
	has  func(c *Capability) bool
	// normalize replaces the scope with a copy whose lists are sorted and
	// de-duplicated, so equal capabilities compare equal.
	normalize func(c *Capability)
	// validate checks every field (optional: a class of flags only has
	// nothing to check).
	validate func(c Capability) error
	// isEmpty: the scope grants nothing.
	isEmpty func(c Capability) bool
	// within (normalized) reports the first field of c that bound does not
	// cover, through widen.
	within func(c, bound Capability, widen func(format string, a ...any) error) error
	// allows (normalized) is the grammar's own meaning of c for one
	// request of the class.
	allows func(c Capability, r UseRequest) bool
	// tier (normalized, not empty) is the class's row of the default tier
	// table.
	tier func(c Capability, tc TierContext) Tier
	// ingredients (normalized, optional) adds what a grant of c gives the
	// session to the two-of-three ingredients.
	ingredients func(c Capability, i Ingredients) Ingredients
	// summary (optional) is the one-line scope of tables and the panel;
	// without it Summary is the capability's JSON.
	summary func(c Capability) string
	// unenforced (optional) refuses a part of the scope that no backend
	// enforces yet, whatever the probe says (an error wrapping
	// ErrNotEnforceable).
	unenforced func(c Capability) error
	// compile (normalized, optional) is the capability's section of the
	// grant's backend.Delta under ref; without it the class has no OS
	// state of its own and compiles to an empty Delta.
	compile func(c Capability, ref backend.HandleRef) backend.Delta
}

// key is one manifest key of a class: how "name=value" sets the scope and
// how the scope renders back ("" leaves the key out).
type key struct {
	name   string
	parse  func(c *Capability, v string) error
	render func(c *Capability) string
}

// specs holds every registered class, by class.
var specs = map[Class]*spec{}

// register adds a class's spec; called from the class's own file (init). A
// class the seam does not name, a second spec for one class or a spec
// missing a required function is a programming error.
func register(s spec) {
	switch {
	case !slices.Contains(Classes, s.class):
		panic(fmt.Sprintf("capability: register %q: not one of backend.Classes", s.class))
	case specs[s.class] != nil:
		panic(fmt.Sprintf("capability: register %q twice", s.class))
	case s.fill == nil || s.has == nil || s.normalize == nil || s.isEmpty == nil || s.within == nil || s.allows == nil || s.tier == nil:
		panic(fmt.Sprintf("capability: register %q: spec lacks a required function", s.class))
	}
	specs[s.class] = &s
}

// specOf returns the spec of class c, nil for an unknown class.
func specOf(c Class) *spec { return specs[c] }

// ManifestKeys lists the manifest keys of class c in the order String
// renders them (nil for an unknown class).
func ManifestKeys(c Class) []string {
	s := specOf(c)
	if s == nil {
		return nil
	}
	out := make([]string, len(s.keys))
	for i, k := range s.keys {
		out[i] = k.name
	}
	return out
}

// Compile is a capability's section of a grant's backend.Delta, every
// entry carried by the grant's handle ref. A class with no OS state of its
// own (its spec has no compile function) compiles to an empty Delta: its
// enforcement, if any, is the backend's probe row.
func Compile(c Capability, ref backend.HandleRef) backend.Delta {
	c = c.Normalized()
	if s := specOf(c.Class); s != nil && s.compile != nil {
		return s.compile(c, ref)
	}
	return backend.Delta{}
}

// Key constructors. field returns the address of the key's field in a
// capability whose scope is set.

// listKey is a comma-separated list of plain strings.
func listKey(name string, field func(c *Capability) *[]string) key {
	return key{name: name,
		parse: func(c *Capability, v string) error {
			l, err := list(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			*field(c) = l
			return nil
		},
		render: func(c *Capability) string { return strings.Join(*field(c), ",") },
	}
}

// boolKey is true or false; only true renders.
func boolKey(name string, field func(c *Capability) *bool) key {
	return key{name: name,
		parse: func(c *Capability, v string) (err error) {
			*field(c), err = boolean(name, v)
			return err
		},
		render: func(c *Capability) string {
			if *field(c) {
				return "true"
			}
			return ""
		},
	}
}

// wordKey is one word, taken as given (the class's validate checks it).
func wordKey(name string, field func(c *Capability) *string) key {
	return key{name: name,
		parse:  func(c *Capability, v string) error { *field(c) = v; return nil },
		render: func(c *Capability) string { return *field(c) },
	}
}

// prefixesKey is a list of prefixes; an address means its /32 or /128.
func prefixesKey(name string, field func(c *Capability) *[]netip.Prefix) key {
	return key{name: name,
		parse: func(c *Capability, v string) error {
			ps, err := list(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			for _, s := range ps {
				p, err := netip.ParsePrefix(s)
				if err != nil {
					a, aerr := netip.ParseAddr(s)
					if aerr != nil {
						return fmt.Errorf("%s: %q is not a prefix or address", name, s)
					}
					p = netip.PrefixFrom(a, a.BitLen())
				}
				*field(c) = append(*field(c), p)
			}
			return nil
		},
		render: func(c *Capability) string {
			s := make([]string, len(*field(c)))
			for i, p := range *field(c) {
				s[i] = p.String()
			}
			return strings.Join(s, ",")
		},
	}
}

// portsKey is a list of ports and lo-hi ranges.
func portsKey(name string, field func(c *Capability) *[]PortRange) key {
	return key{name: name,
		parse: func(c *Capability, v string) error {
			ps, err := list(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			for _, s := range ps {
				r, err := ParsePortRange(s)
				if err != nil {
					return fmt.Errorf("%s: %q is not a port or lo-hi range", name, s)
				}
				*field(c) = append(*field(c), r)
			}
			return nil
		},
		render: func(c *Capability) string { return portList(*field(c)) },
	}
}

func list(v string) ([]string, error) {
	if v == "" {
		return nil, fmt.Errorf("empty list")
	}
	parts := strings.Split(v, ",")
	if slices.Contains(parts, "") {
		return nil, fmt.Errorf("empty element in %q", v)
	}
	return parts, nil
}

func boolean(k, v string) (bool, error) {
	switch v {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q: want true or false", k, v)
}
