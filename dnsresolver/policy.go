package dnsresolver

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Policy errors.
var (
	ErrInvalidPattern = errors.New("dnsresolver: invalid pattern")
	ErrInvalidGrant   = errors.New("dnsresolver: invalid grant")
)

// PatternKind says which names a Pattern matches.
type PatternKind uint8

const (
	// Exact ("host") matches host only.
	Exact PatternKind = iota
	// Subdomains ("*.host") matches strict subdomains of host, at any depth,
	// and not host itself.
	Subdomains
	// ApexAndSubdomains ("**.host") matches host and all its subdomains.
	ApexAndSubdomains
)

// Pattern is a parsed allow or deny pattern.
type Pattern struct {
	Kind PatternKind
	Base string // canonical name
}

func (p Pattern) String() string {
	switch p.Kind {
	case Subdomains:
		return "*." + p.Base
	case ApexAndSubdomains:
		return "**." + p.Base
	}
	return p.Base
}

// Match reports whether the canonical name matches p.
func (p Pattern) Match(name string) bool {
	switch p.Kind {
	case Exact:
		return name == p.Base
	case Subdomains:
		return len(name) > len(p.Base)+1 && strings.HasSuffix(name, p.Base) && name[len(name)-len(p.Base)-1] == '.'
	case ApexAndSubdomains:
		return name == p.Base || (len(name) > len(p.Base)+1 && strings.HasSuffix(name, p.Base) && name[len(name)-len(p.Base)-1] == '.')
	}
	return false
}

// ParsePattern parses "host", "*.host" or "**.host". The host part must pass
// CanonicalName. Refused: a bare "*" or "**", a wildcard anywhere but as the
// whole leftmost label ("a*.b", "a.*.b", "*b.c", "***.b"), and a wildcard over
// a single label ("*.com", "**.com": a whole top-level domain). There is no
// public-suffix list here, so "*.co.uk" is accepted; the agent is where broad
// patterns are flagged.
func ParsePattern(s string) (Pattern, error) {
	var p Pattern
	rest := s
	switch {
	case s == "*" || s == "**" || s == "*." || s == "**.":
		return p, fmt.Errorf("%w: %q: a bare wildcard matches every name", ErrInvalidPattern, s)
	case strings.HasPrefix(s, "**."):
		p.Kind, rest = ApexAndSubdomains, s[3:]
	case strings.HasPrefix(s, "*."):
		p.Kind, rest = Subdomains, s[2:]
	}
	if strings.Contains(rest, "*") {
		return p, fmt.Errorf("%w: %q: a wildcard may only be the whole leftmost label, as *.host or **.host", ErrInvalidPattern, s)
	}
	base, err := CanonicalName(rest)
	if err != nil {
		return p, fmt.Errorf("%w: %q: %w", ErrInvalidPattern, s, err)
	}
	if p.Kind != Exact && !strings.Contains(base, ".") {
		return p, fmt.Errorf("%w: %q: a wildcard over a whole top-level domain", ErrInvalidPattern, s)
	}
	p.Base = base
	return p, nil
}

// Grant lets a session resolve the names Pattern matches and reach the
// addresses they resolve to, with Proto on Ports, while Handle is live.
type Grant struct {
	// Pattern is "host", "*.host" or "**.host" (see ParsePattern).
	Pattern string
	// Handle is the grant's caretaker handle; every entry written for this
	// grant carries it, so revoking the handle cuts them all at once.
	Handle backend.HandleRef
	// Proto and Ports are copied into every entry.
	Proto backend.Proto
	Ports backend.PortRange
	// AllowNonPublic lists non-public ranges (see IsPublic) this grant may
	// resolve to, e.g. 10.0.0.0/8 for an internal service. Non-public
	// addresses outside these are dropped from answers. IPv4-mapped IPv6
	// answers are always dropped. An address of the host itself
	// (Config.HostAddrs), public or not, is dropped unless a prefix here
	// is exactly that address (a /32 or /128): a wider range holding it
	// does not name it.
	AllowNonPublic []netip.Prefix
}

// Policy is one session's DNS authority.
type Policy struct {
	// Grants: a name is allowed when at least one grant matches it. An answer
	// is written to the kernel once per matching grant.
	Grants []Grant
	// Deny patterns override grants, for the question name and every name on
	// its CNAME chain.
	Deny []string
}

// Equal reports whether p and q are the same policy: the same grants in the
// same order, field for field, and the same deny patterns.
func (p Policy) Equal(q Policy) bool {
	return slices.EqualFunc(p.Grants, q.Grants, func(a, b Grant) bool {
		return a.Pattern == b.Pattern && a.Handle == b.Handle && a.Proto == b.Proto && a.Ports == b.Ports &&
			slices.Equal(a.AllowNonPublic, b.AllowNonPublic)
	}) && slices.Equal(p.Deny, q.Deny)
}

type compiledGrant struct {
	Grant
	pat Pattern
}

// compiledPolicy indexes patterns by base name, so matching costs one map
// lookup per label of the query name, whatever the number of grants.
type compiledPolicy struct {
	exact   map[string][]*compiledGrant // Exact and ApexAndSubdomains, by base
	sub     map[string][]*compiledGrant // Subdomains and ApexAndSubdomains, by base
	denyEx  map[string]bool
	denySub map[string]bool
}

// emptyPolicy is every session's compiled policy while it has no grants and
// no deny patterns: one shared value (nil maps read as empty) instead of
// four empty maps a session (~400 bytes each at 100,000 sessions). A
// compiled policy is never changed once compiled, so sharing it is safe.
var emptyPolicy = &compiledPolicy{}

func compilePolicy(p Policy) (*compiledPolicy, error) {
	if len(p.Grants) == 0 && len(p.Deny) == 0 {
		return emptyPolicy, nil
	}
	c := &compiledPolicy{
		exact: map[string][]*compiledGrant{}, sub: map[string][]*compiledGrant{},
		denyEx: map[string]bool{}, denySub: map[string]bool{},
	}
	for i, g := range p.Grants {
		pat, err := ParsePattern(g.Pattern)
		if err != nil {
			return nil, fmt.Errorf("grant %d: %w", i, err)
		}
		if g.Handle.IsZero() {
			return nil, fmt.Errorf("%w: grant %d (%s): no handle", ErrInvalidGrant, i, g.Pattern)
		}
		switch g.Proto {
		case backend.ProtoAny, backend.ProtoTCP, backend.ProtoUDP:
		default:
			return nil, fmt.Errorf("%w: grant %d (%s): protocol %d", ErrInvalidGrant, i, g.Pattern, g.Proto)
		}
		if err := g.Ports.Validate(); err != nil {
			return nil, fmt.Errorf("%w: grant %d (%s): %w", ErrInvalidGrant, i, g.Pattern, err)
		}
		for _, pfx := range g.AllowNonPublic {
			if !pfx.IsValid() || pfx.Addr().Zone() != "" {
				return nil, fmt.Errorf("%w: grant %d (%s): bad AllowNonPublic prefix %v", ErrInvalidGrant, i, g.Pattern, pfx)
			}
		}
		cg := &compiledGrant{Grant: g, pat: pat}
		cg.AllowNonPublic = make([]netip.Prefix, len(g.AllowNonPublic))
		for j, pfx := range g.AllowNonPublic {
			cg.AllowNonPublic[j] = pfx.Masked()
		}
		if pat.Kind != Subdomains {
			c.exact[pat.Base] = append(c.exact[pat.Base], cg)
		}
		if pat.Kind != Exact {
			c.sub[pat.Base] = append(c.sub[pat.Base], cg)
		}
	}
	for i, d := range p.Deny {
		pat, err := ParsePattern(d)
		if err != nil {
			return nil, fmt.Errorf("deny %d: %w", i, err)
		}
		if pat.Kind != Subdomains {
			c.denyEx[pat.Base] = true
		}
		if pat.Kind != Exact {
			c.denySub[pat.Base] = true
		}
	}
	return c, nil
}

// denied reports whether a deny pattern matches the canonical name.
func (c *compiledPolicy) denied(name string) bool {
	if c.denyEx[name] {
		return true
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '.' && c.denySub[name[i+1:]] {
			return true
		}
	}
	return false
}

// grants returns every grant matching the canonical name (deny not applied).
func (c *compiledPolicy) grants(name string) []*compiledGrant {
	out := c.exact[name]
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			if gs := c.sub[name[i+1:]]; len(gs) > 0 {
				out = append(out[:len(out):len(out)], gs...)
			}
		}
	}
	return out
}
