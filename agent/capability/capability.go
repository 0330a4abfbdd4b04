package capability

// Decision layer: the capability grammar. The nine classes (the seed's
// eight, plus net.inbound, the seed's NetworkGrant.inbound as its own grant), their typed
// scopes (the zero scope grants nothing), normalization, validation and the
// manifest-syntax rendering. Containment (Within) is in capability_within.go.

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
)

// Classes lists the classes in the seed's order, net.inbound after
// net.egress.
var Classes = backend.Classes

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

// EgressScope is the scope of net.egress. Domains are exact names, "*.name"
// (proper subdomains only) or "**.name" (the name and its subdomains). An
// empty Ports list means every port. TLSInspect asks that the flows go through
// the TLS-inspecting proxy; a scope with it set is narrower than one without.
type EgressScope struct {
	Domains    []string       `json:"domains,omitempty"`
	CIDRs      []netip.Prefix `json:"cidrs,omitempty"`
	Ports      []PortRange    `json:"ports,omitempty"`
	TLSInspect bool           `json:"tls_inspect,omitempty"`
}

// InboundScope is the scope of net.inbound: peers in CIDRs may open flows
// to the session's own Ports (a TCP connection to a listener, a datagram to
// an unconnected UDP socket); an empty Ports list means every local port.
// No CIDR: nobody may connect in (the zero scope). A connection admitted
// under it carries data both ways for as long as the grant lives; it never
// lets the session connect or send anywhere (that is net.egress).
type InboundScope struct {
	CIDRs []netip.Prefix `json:"cidrs,omitempty"`
	Ports []PortRange    `json:"ports,omitempty"`
}

// FSScope is the scope of fs.scope: absolute, clean path prefixes. Write does
// not imply read. A path under a Deny entry is denied whatever Read and Write
// say (deny wins; stricter than the seed's narrowest-last ordering).
type FSScope struct {
	Read  []string `json:"read,omitempty"`
	Write []string `json:"write,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// ClipboardScope is the scope of clipboard; both directions default to off.
type ClipboardScope struct {
	PasteIn bool `json:"paste_in,omitempty"`
	CopyOut bool `json:"copy_out,omitempty"`
}

// GPU modes. GPUModeRaw (raw device access) is an extension of the seed's
// compute|render: it exists so a manifest can name it, and it is Block tier.
const (
	GPUModeCompute = "compute"
	GPUModeRender  = "render"
	GPUModeRaw     = "raw"
)

// GPUScope is the scope of gpu.
type GPUScope struct {
	DeviceIDs []string `json:"device_ids,omitempty"`
	Mode      string   `json:"mode,omitempty"`
}

// Install scopes.
const (
	InstallPkg = "pkg"
	InstallAny = "any"
)

// InstallScope is the scope of install.privileged: "pkg" (package installs
// through a broker) or "any" (sudo; Block tier).
type InstallScope struct {
	Scope string `json:"scope,omitempty"`
}

// PersistenceScope is the scope of persistence.
type PersistenceScope struct {
	Paths           []string `json:"paths,omitempty"`
	SurvivesSession bool     `json:"survives_session,omitempty"`
}

// CredentialsScope is the scope of credentials. NeverRaw is an invariant: it
// must be true in every credentials capability (the model never sees a
// plaintext secret; the broker injects it).
type CredentialsScope struct {
	BrokerScopes []string `json:"broker_scopes,omitempty"`
	NeverRaw     bool     `json:"never_raw"`
}

// PeripheralScope is the scope of peripheral.
type PeripheralScope struct {
	Camera      bool     `json:"camera,omitempty"`
	Mic         bool     `json:"mic,omitempty"`
	USB         []string `json:"usb,omitempty"`
	InputInject bool     `json:"input_inject,omitempty"`
}

// Capability is one typed capability: its class and the scope of that class.
// Exactly the field matching Class is set (nil means the empty scope). The
// zero scope of every class grants nothing.
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
	switch c.Class {
	case ClassNetEgress:
		if c.Egress == nil {
			c.Egress = &EgressScope{}
		}
	case ClassNetInbound:
		if c.Inbound == nil {
			c.Inbound = &InboundScope{}
		}
	case ClassFSScope:
		if c.FS == nil {
			c.FS = &FSScope{}
		}
	case ClassClipboard:
		if c.Clipboard == nil {
			c.Clipboard = &ClipboardScope{}
		}
	case ClassGPU:
		if c.GPU == nil {
			c.GPU = &GPUScope{}
		}
	case ClassInstall:
		if c.Install == nil {
			c.Install = &InstallScope{}
		}
	case ClassPersistence:
		if c.Persistence == nil {
			c.Persistence = &PersistenceScope{}
		}
	case ClassCredentials:
		if c.Credentials == nil {
			c.Credentials = &CredentialsScope{NeverRaw: true}
		}
	case ClassPeripheral:
		if c.Peripheral == nil {
			c.Peripheral = &PeripheralScope{}
		}
	}
}

// Normalized returns a copy with its scope filled, lists sorted and
// de-duplicated, and domains lower-cased, so equal capabilities compare equal.
func (c Capability) Normalized() Capability {
	c.fill()
	switch c.Class {
	case ClassNetEgress:
		e := *c.Egress
		e.Domains = sortedUnique(lower(e.Domains))
		e.CIDRs = sortedPrefixes(e.CIDRs)
		e.Ports = sortedPorts(e.Ports)
		c.Egress = &e
	case ClassNetInbound:
		c.Inbound = &InboundScope{CIDRs: sortedPrefixes(c.Inbound.CIDRs), Ports: sortedPorts(c.Inbound.Ports)}
	case ClassFSScope:
		f := FSScope{Read: sortedUnique(c.FS.Read), Write: sortedUnique(c.FS.Write), Deny: sortedUnique(c.FS.Deny)}
		c.FS = &f
	case ClassClipboard:
		v := *c.Clipboard
		c.Clipboard = &v
	case ClassGPU:
		g := GPUScope{DeviceIDs: sortedUnique(c.GPU.DeviceIDs), Mode: c.GPU.Mode}
		c.GPU = &g
	case ClassInstall:
		v := *c.Install
		c.Install = &v
	case ClassPersistence:
		p := PersistenceScope{Paths: sortedUnique(c.Persistence.Paths), SurvivesSession: c.Persistence.SurvivesSession}
		c.Persistence = &p
	case ClassCredentials:
		v := CredentialsScope{BrokerScopes: sortedUnique(c.Credentials.BrokerScopes), NeverRaw: c.Credentials.NeverRaw}
		c.Credentials = &v
	case ClassPeripheral:
		v := *c.Peripheral
		v.USB = sortedUnique(v.USB)
		c.Peripheral = &v
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
	set := 0
	for _, p := range []bool{c.Egress != nil, c.Inbound != nil, c.FS != nil, c.Clipboard != nil, c.GPU != nil, c.Install != nil, c.Persistence != nil, c.Credentials != nil, c.Peripheral != nil} {
		if p {
			set++
		}
	}
	c2 := c
	c2.fill()
	if set > 1 || (set == 1 && !c.scopeFieldSet()) {
		return fmt.Errorf("%w: %s capability carries the scope of another class", ErrInvalidCapability, c.Class)
	}
	c = c2
	switch c.Class {
	case ClassNetEgress:
		for _, d := range c.Egress.Domains {
			if err := ValidateDomainPattern(d); err != nil {
				return err
			}
		}
		for _, p := range c.Egress.CIDRs {
			if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" || p.Addr().Is4In6() {
				return fmt.Errorf("%w: net.egress cidr %v (want a masked prefix without zone, IPv4 in IPv4 form)", ErrInvalidCapability, p)
			}
		}
		for _, r := range c.Egress.Ports {
			if err := r.validate(); err != nil {
				return err
			}
		}
	case ClassNetInbound:
		for _, p := range c.Inbound.CIDRs {
			if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" || p.Addr().Is4In6() {
				return fmt.Errorf("%w: net.inbound cidr %v (want a masked prefix without zone, IPv4 in IPv4 form)", ErrInvalidCapability, p)
			}
		}
		for _, r := range c.Inbound.Ports {
			if err := r.validate(); err != nil {
				return err
			}
		}
	case ClassFSScope:
		for _, l := range [][]string{c.FS.Read, c.FS.Write, c.FS.Deny} {
			for _, p := range l {
				if err := ValidatePath(p); err != nil {
					return err
				}
			}
		}
	case ClassGPU:
		switch c.GPU.Mode {
		case GPUModeCompute, GPUModeRender, GPUModeRaw:
		case "":
			if len(c.GPU.DeviceIDs) > 0 {
				return fmt.Errorf("%w: gpu device_ids without a mode", ErrInvalidCapability)
			}
		default:
			return fmt.Errorf("%w: gpu mode %q (want compute, render or raw)", ErrInvalidCapability, c.GPU.Mode)
		}
		for _, id := range c.GPU.DeviceIDs {
			if err := ValidateToken("gpu device id", id); err != nil {
				return err
			}
		}
	case ClassInstall:
		switch c.Install.Scope {
		case "", InstallPkg, InstallAny:
		default:
			return fmt.Errorf("%w: install.privileged scope %q (want pkg or any)", ErrInvalidCapability, c.Install.Scope)
		}
	case ClassPersistence:
		for _, p := range c.Persistence.Paths {
			if err := ValidatePath(p); err != nil {
				return err
			}
		}
	case ClassCredentials:
		if !c.Credentials.NeverRaw {
			return fmt.Errorf("%w: credentials never_raw must be true (a plaintext secret is never handed to a session)", ErrInvalidCapability)
		}
		for _, s := range c.Credentials.BrokerScopes {
			if err := ValidateToken("broker scope", s); err != nil {
				return err
			}
		}
	case ClassPeripheral:
		for _, u := range c.Peripheral.USB {
			if err := ValidateToken("usb id", u); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c Capability) scopeFieldSet() bool {
	switch c.Class {
	case ClassNetEgress:
		return c.Egress != nil
	case ClassNetInbound:
		return c.Inbound != nil
	case ClassFSScope:
		return c.FS != nil
	case ClassClipboard:
		return c.Clipboard != nil
	case ClassGPU:
		return c.GPU != nil
	case ClassInstall:
		return c.Install != nil
	case ClassPersistence:
		return c.Persistence != nil
	case ClassCredentials:
		return c.Credentials != nil
	case ClassPeripheral:
		return c.Peripheral != nil
	}
	return false
}

// IsEmpty reports whether the capability grants nothing.
func (c Capability) IsEmpty() bool {
	c.fill()
	switch c.Class {
	case ClassNetEgress:
		return len(c.Egress.Domains) == 0 && len(c.Egress.CIDRs) == 0
	case ClassNetInbound:
		return len(c.Inbound.CIDRs) == 0
	case ClassFSScope:
		return len(c.FS.Read) == 0 && len(c.FS.Write) == 0
	case ClassClipboard:
		return !c.Clipboard.PasteIn && !c.Clipboard.CopyOut
	case ClassGPU:
		return len(c.GPU.DeviceIDs) == 0
	case ClassInstall:
		return c.Install.Scope == ""
	case ClassPersistence:
		return len(c.Persistence.Paths) == 0
	case ClassCredentials:
		return len(c.Credentials.BrokerScopes) == 0
	case ClassPeripheral:
		p := c.Peripheral
		return !p.Camera && !p.Mic && !p.InputInject && len(p.USB) == 0
	}
	return true
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
