package capability

// Decision layer: the capability grammar. The nine classes (the seed's
// eight, plus net.inbound, the seed's NetworkGrant.inbound as its own grant),
// the Capability that holds one class's typed scope (the zero scope grants
// nothing), normalization and validation. Each class is one registry entry
// in its own file (class_<name>.go: its scope type, manifest keys,
// validation, containment, default tier and compile function; registry.go
// says what an entry holds); the functions here look the class up there.
// Containment (Within) is in capability_within.go, the renderings in
// capability_render.go.

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Class names one of the capability classes of the grammar
// (seeds/permissions.md §3.1): the seam's one typed enum (backend.Class).
// The zero value is not a class.
type Class = backend.Class

const (
	ClassNetEgress   = backend.ClassNetEgress
	ClassNetInbound  = backend.ClassNetInbound
	ClassFSScope     = backend.ClassFSScope
	ClassClipboard   = backend.ClassClipboard
	ClassGPU         = backend.ClassGPU
	ClassInstall     = backend.ClassInstall
	ClassPersistence = backend.ClassPersistence
	ClassCredentials = backend.ClassCredentials
	ClassPeripheral  = backend.ClassPeripheral
	ClassProcess     = backend.ClassProcess
)

// Classes lists the classes in the seed's order, net.inbound after
// net.egress.
var Classes = backend.Classes

// NumClasses is len(Classes), a constant: per-class tables may be arrays.
const NumClasses = backend.NumClasses

// ParseClass parses a class name.
func ParseClass(s string) (Class, error) {
	for _, c := range Classes {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: unknown class %q", ErrInvalidCapability, s)
}

// Errors of the grammar.
var (
	ErrInvalidCapability = errors.New("agent: invalid capability")
	ErrWidens            = errors.New("agent: capability widens its bound")
)

// PortRange is an inclusive destination port range; the zero value is not a
// valid range inside a scope (an empty Ports list means "any port").
type PortRange struct {
	Lo uint16 `json:"lo"`
	Hi uint16 `json:"hi"`
}

func (r PortRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(int(r.Lo))
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

func (r PortRange) validate() error {
	if r.Lo == 0 || r.Hi == 0 || r.Lo > r.Hi {
		return fmt.Errorf("%w: port range %d-%d", ErrInvalidCapability, r.Lo, r.Hi)
	}
	return nil
}

// ParsePortRange parses "443" or "8000-8100".
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	l, err := strconv.ParseUint(lo, 10, 16)
	if err != nil {
		return PortRange{}, fmt.Errorf("%w: port %q", ErrInvalidCapability, s)
	}
	h := l
	if isRange {
		if h, err = strconv.ParseUint(hi, 10, 16); err != nil {
			return PortRange{}, fmt.Errorf("%w: port %q", ErrInvalidCapability, s)
		}
	}
	r := PortRange{uint16(l), uint16(h)}
	return r, r.validate()
}

// Capability is one typed capability: its class and the scope of that class.
// Exactly the field matching Class is set (nil means the empty scope). The
// zero scope of every class grants nothing. A class adds its field here (its
// JSON name is the class name with '.' as '_'); the scope type lives in the
// class's own file.
type Capability struct {
	Class       Class             `json:"class"`
	Egress      *EgressScope      `json:"net_egress,omitempty"`
	Inbound     *InboundScope     `json:"net_inbound,omitempty"`
	FS          *FSScope          `json:"fs_scope,omitempty"`
	Clipboard   *ClipboardScope   `json:"clipboard,omitempty"`
	GPU         *GPUScope         `json:"gpu,omitempty"`
	Install     *InstallScope     `json:"install_privileged,omitempty"`
	Persistence *PersistenceScope `json:"persistence,omitempty"`
	Credentials *CredentialsScope `json:"credentials,omitempty"`
	Peripheral  *PeripheralScope  `json:"peripheral,omitempty"`
	Process     *ProcessScope     `json:"process,omitempty"`
}

// Empty returns the empty (zero-authority) capability of class c.
func Empty(c Class) Capability {
	cp := Capability{Class: c}
	cp.fill()
	return cp
}

// fill sets the scope pointer of the capability's class to its zero value
// when nil, so callers can read it without nil checks.
func (c *Capability) fill() {
	if s := specOf(c.Class); s != nil {
		s.fill(c)
	}
}

// Normalized returns a copy with its scope filled, lists sorted and
// de-duplicated, and domains lower-cased, so equal capabilities compare equal.
func (c Capability) Normalized() Capability {
	if s := specOf(c.Class); s != nil {
		s.fill(&c)
		s.normalize(&c)
	}
	return c
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if x := a.Addr().Compare(b.Addr()); x != 0 {
			return x
		}
		return cmp.Compare(a.Bits(), b.Bits())
	})
	return slices.Compact(ps)
}

func sortedPorts(ps []PortRange) []PortRange {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b PortRange) int { return cmp.Or(cmp.Compare(a.Lo, b.Lo), cmp.Compare(a.Hi, b.Hi)) })
	return slices.Compact(ps)
}

func lower(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.ToLower(v)
	}
	return out
}

func sortedUnique(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// Validate checks that exactly the class's scope is set and that every field
// is well formed, including the credentials never_raw invariant.
func (c Capability) Validate() error {
	if _, err := ParseClass(string(c.Class)); err != nil {
		return err
	}
	s := specOf(c.Class)
	if s == nil {
		return fmt.Errorf("%w: class %q has no grammar", ErrInvalidCapability, c.Class)
	}
	set := 0
	for _, o := range specs {
		if o.has(&c) {
			set++
		}
	}
	if set > 1 || (set == 1 && !s.has(&c)) {
		return fmt.Errorf("%w: %s capability carries the scope of another class", ErrInvalidCapability, c.Class)
	}
	s.fill(&c)
	if s.validate == nil {
		return nil
	}
	return s.validate(c)
}

// IsEmpty reports whether the capability grants nothing.
func (c Capability) IsEmpty() bool {
	s := specOf(c.Class)
	if s == nil {
		return true
	}
	s.fill(&c)
	return s.isEmpty(c)
}

// ValidateToken accepts a plain token (an image name, a gpu device id, a
// broker scope, a usb id): 1 to 128 characters of [A-Za-z0-9._:/@-]; what
// names it in the error.
func ValidateToken(what, s string) error {
	if s == "" || len(s) > 128 {
		return fmt.Errorf("%w: %s %q", ErrInvalidCapability, what, s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:/-@", r)) {
			return fmt.Errorf("%w: %s %q has character %q", ErrInvalidCapability, what, s, r)
		}
	}
	return nil
}

// ValidatePath accepts absolute, clean paths without control characters.
func ValidatePath(p string) error {
	if p == "" || p[0] != '/' || path.Clean(p) != p {
		return fmt.Errorf("%w: path %q is not absolute and clean", ErrInvalidCapability, p)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: path %q has a control character", ErrInvalidCapability, p)
		}
	}
	return nil
}

// ValidateDomainPattern accepts "name", "*.name" and "**.name" where name is a
// DNS name of at least two labels (a bare "*" or "*.com"-style TLD wildcard is
// refused) made of [a-z0-9-] labels; the check runs before any allowlist use,
// so NUL, percent-encoding and control characters never get through.
func ValidateDomainPattern(d string) error {
	name := strings.TrimPrefix(strings.TrimPrefix(d, "**."), "*.")
	if len(d) > 253 || name == "" {
		return fmt.Errorf("%w: domain %q", ErrInvalidCapability, d)
	}
	if name != d && !strings.Contains(name, ".") {
		return fmt.Errorf("%w: domain wildcard %q is too broad (wildcards need at least two labels)", ErrInvalidCapability, d)
	}
	for l := range strings.SplitSeq(name, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%w: domain %q has an invalid label %q", ErrInvalidCapability, d, l)
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("%w: domain %q has character %q (want lower-case a-z, 0-9, -)", ErrInvalidCapability, d, r)
			}
		}
	}
	return nil
}
