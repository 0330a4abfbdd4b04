package shiftproof

import (
	"fmt"
	"math/big"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// This file is the request space: the SMT variables one request is made of,
// the constraints that keep them to requests the agent can build, the
// meaning of the derived key sets (path_keys, domain_keys, cidr_keys,
// port_keys) and the reading of a model back into a Request.

// Domain is the part of the request space the agent validates before any
// request reaches Cedar: the resource classes and the enumerated attributes.
// A request outside it is never built, so the proof need not cover it.
type Domain struct {
	Classes     []string // Shinken::Capability ids
	TrustTiers  []string // principal.trust_tier
	Risks       []string // principal.risk
	Tiers       []string // context.tier (grant)
	Provenances []string // context.provenance (grant)
	Lifecycles  []string // context.lifecycle (grant)
}

// ShinkenDomain is the agent's request space (agent.Classes, SessionSpec
// validation, Tier.String, Provenance, Lifecycle).
var ShinkenDomain = Domain{
	Classes:     []string{"net.egress", "net.inbound", "fs.scope", "clipboard", "gpu", "install.privileged", "persistence", "credentials", "peripheral"},
	TrustTiers:  []string{"low", "normal", "high"},
	Risks:       []string{"normal", "high"},
	Tiers:       []string{"auto", "notify", "ask", "block"},
	Provenances: []string{"first-party", "external"},
	Lifecycles:  []string{"once", "session", "standing"},
}

// Session is the principal of a counterexample.
type Session struct {
	ID, Image, TrustTier, Risk string
	Headless, TLSInspection    bool
	Protected, PolicyStore     []string
}

// Request is one concrete request read from a model. For Action "use" the
// key sets are derived from Path, Domain, IP and Port exactly as the agent
// derives them; for "grant" the scope sets are given as they are.
type Request struct {
	Action  string // "use" | "grant"
	Class   string
	Session Session
	Now     time.Time

	// use
	Op, Path, Domain, Item, Mode string
	IP                           netip.Addr
	Port                         uint16

	// grant
	Tier, Provenance, Lifecycle string
	WriteKeys, Flags            []string
	TLSInspect                  bool
	ScopeMode                   string
}

func (r *Request) String() string {
	s := r.Session
	who := fmt.Sprintf("session %q (image=%q trust=%s risk=%s tls_inspection=%t headless=%t protected=%q policy_store=%q)",
		s.ID, s.Image, s.TrustTier, s.Risk, s.TLSInspection, s.Headless, s.Protected, s.PolicyStore)
	if r.Action == "grant" {
		return fmt.Sprintf("%s grant %s tier=%s provenance=%s lifecycle=%s scope{write_keys=%q tls_inspect=%t mode=%q flags=%q}",
			who, r.Class, r.Tier, r.Provenance, r.Lifecycle, r.WriteKeys, r.TLSInspect, r.ScopeMode, r.Flags)
	}
	what := "op=" + strconv.Quote(r.Op)
	if r.Domain != "" {
		what += " domain=" + r.Domain
	}
	if r.IP.IsValid() {
		what += " ip=" + r.IP.String()
	}
	if r.Class == "net.egress" || r.Class == "net.inbound" {
		what += fmt.Sprintf(" port=%d", r.Port)
	}
	if r.Path != "" {
		what += " path=" + r.Path
	}
	if r.Item != "" {
		what += " item=" + strconv.Quote(r.Item)
	}
	if r.Mode != "" {
		what += " mode=" + strconv.Quote(r.Mode)
	}
	return fmt.Sprintf("%s use %s [%s]", who, r.Class, what)
}

// The free string sets: attributes whose value is any finite set of
// strings. Each is modelled by slots (an element and an "in the set" bit);
// the number of slots is what the policies can observe (see slotNeed).
var freeSets = map[string]string{
	"principal.protected":      "fs_prot",
	"principal.policy_store":   "fs_pstore",
	"context.scope.write_keys": "fs_wkeys",
	"context.scope.flags":      "fs_flags",
}

// attribute tables: what each record or entity holds, by environment.
type attrKind struct {
	k    kind
	name string // SMT variable, free set or derived set name, or record path
}

func attributes(action, rec string) map[string]attrKind {
	switch rec {
	case "principal":
		return map[string]attrKind{
			"image": {kString, "p_image"}, "trust_tier": {kString, "p_trust"}, "risk": {kString, "p_risk"},
			"headless": {kBool, "p_headless"}, "tls_inspection": {kBool, "p_tls"},
			"protected": {kSet, "principal.protected"}, "policy_store": {kSet, "principal.policy_store"},
		}
	case "context":
		if action == "use" {
			return map[string]attrKind{"now": {kDatetime, "now"}, "request": {kRecord, "context.request"}}
		}
		return map[string]attrKind{"now": {kDatetime, "now"}, "tier": {kString, "g_tier"}, "provenance": {kString, "g_prov"},
			"lifecycle": {kString, "g_life"}, "scope": {kRecord, "context.scope"}}
	case "context.request":
		return map[string]attrKind{"op": {kString, "u_op"}, "item": {kString, "u_item"}, "mode": {kString, "u_mode"},
			"path_keys": {kSet, "path"}, "domain_keys": {kSet, "domain"}, "cidr_keys": {kSet, "cidr"}, "port_keys": {kSet, "port"}}
	case "context.scope":
		return map[string]attrKind{"write_keys": {kSet, "context.scope.write_keys"}, "tls_inspect": {kBool, "g_tls"},
			"mode": {kString, "g_mode"}, "flags": {kSet, "context.scope.flags"}}
	}
	return nil
}

// SMT pieces of the request space.
const (
	reC     = `(re.union (re.range " " ".") (re.range "0" "~") (re.range "\u{80}" "\u{2ffff}"))`
	reD     = `(re.union (re.range " " "-") (re.range "0" "~") (re.range "\u{80}" "\u{2ffff}"))`
	reAlnum = `(re.union (re.range "a" "z") (re.range "0" "9"))`
)

// rePath: "/" or ("/" segment)+ with no "." or ".." segment and no control
// character: exactly the paths validatePath accepts (absolute and clean).
var rePath = fmt.Sprintf(`(re.union (str.to_re "/") (re.+ (re.++ (str.to_re "/") (re.union %s (re.++ %s %s) (re.++ %s %s) (re.++ %s %s (re.+ %s))))))`,
	reD, reC, reD, reD, reC, reC, reC, reC)

// reLabel / reDomain: lower-case labels of 1 to 63 [a-z0-9-], no hyphen at
// either end, joined by dots (validateDomainPattern on a request name).
var reLabel = fmt.Sprintf(`(re.union %s (re.++ %s ((_ re.loop 0 61) (re.union %s (str.to_re "-"))) %s))`, reAlnum, reAlnum, reAlnum, reAlnum)
var reDomain = fmt.Sprintf(`(re.++ %s (re.* (re.++ (str.to_re ".") %s)))`, reLabel, reLabel)

func oneOf(v string, vals []string) string {
	var xs []string
	for _, x := range vals {
		xs = append(xs, eq(v, smtString(x)))
	}
	return or(xs...)
}

// declareRequest adds the request's variables and their constraints to e.
// The path and name grammars (regular expressions) are asserted only in
// strict mode: they are hard for the string solver in unsat proofs, and
// leaving them out only widens the space searched (an unsat answer stays a
// proof). A relaxed model whose path or name is not valid is re-solved in
// strict mode.
func (e *enc) declareRequest() {
	d := e.dom
	e.decl("p_id", "String")
	e.decl("p_image", "String")
	e.decl("p_trust", "String")
	e.decl("p_risk", "String")
	e.decl("p_headless", "Bool")
	e.decl("p_tls", "Bool")
	e.decl("r_class", "String")
	e.decl("now", "Int")
	e.assert(oneOf("p_trust", d.TrustTiers), oneOf("p_risk", d.Risks), oneOf("r_class", d.Classes),
		"(>= now (- 9223372036854775808))", "(<= now 9223372036854775807)")
	if e.action == "use" {
		for _, v := range []string{"u_op", "u_item", "u_mode", "u_path", "u_dom"} {
			e.decl(v, "String")
		}
		for _, v := range []string{"u_has_path", "u_has_dom", "u_has_ip", "u_is4"} {
			e.decl(v, "Bool")
		}
		e.decl("u_ip4", "(_ BitVec 32)")
		e.decl("u_ip6", "(_ BitVec 128)")
		e.decl("u_port", "(_ BitVec 16)")
		e.assert(`(not (= u_op ""))`,
			// a path is absolute; an address is never IPv4-mapped IPv6 (the agent unmaps it)
			`(=> u_has_path (str.prefixof "/" u_path))`,
			"(not (= ((_ extract 127 32) u_ip6) #x00000000000000000000ffff))")
		if e.strict {
			e.assert("(=> u_has_path (str.in_re u_path "+rePath+"))",
				"(=> u_has_dom (and (<= (str.len u_dom) 253) (str.in_re u_dom "+reDomain+")))")
		}
	} else {
		for _, v := range []string{"g_tier", "g_prov", "g_life", "g_mode"} {
			e.decl(v, "String")
		}
		e.decl("g_tls", "Bool")
		e.assert(oneOf("g_tier", d.Tiers), oneOf("g_prov", d.Provenances), oneOf("g_life", d.Lifecycles))
	}
	for path, base := range freeSets {
		for i := 0; i < e.slots[path]; i++ {
			e.decl(fmt.Sprintf("%s_%d", base, i), "String")
			e.decl(fmt.Sprintf("%s_%d_in", base, i), "Bool")
		}
	}
}

// derivedPresent: the derived key set is not empty.
func derivedPresent(name string) string {
	switch name {
	case "path":
		return "u_has_path"
	case "domain":
		return "u_has_dom"
	case "cidr":
		return "u_has_ip"
	case "port":
		return `(or (= r_class "net.egress") (= r_class "net.inbound"))` // the agent adds port keys to every request of these
	}
	return "false"
}

// memberLit: the literal string lit is a key of the derived set.
func memberLit(name, lit string) string {
	switch name {
	case "path":
		if lit == "/" {
			return "u_has_path"
		}
		if !validPath(lit) {
			return "false"
		}
		return and("u_has_path", or(eq("u_path", smtString(lit)), "(str.prefixof "+smtString(lit+"/")+" u_path)"))
	case "domain":
		// keys of d: d, "**."+d, and "*."+s, "**."+s for every proper suffix s
		if s, ok := strings.CutPrefix(lit, "**."); ok {
			return and("u_has_dom", or(eq("u_dom", smtString(s)), "(str.suffixof "+smtString("."+s)+" u_dom)"))
		}
		if s, ok := strings.CutPrefix(lit, "*."); ok {
			return and("u_has_dom", "(str.suffixof "+smtString("."+s)+" u_dom)")
		}
		return and("u_has_dom", eq("u_dom", smtString(lit)))
	case "cidr":
		p, err := netip.ParsePrefix(lit)
		if err != nil || p != p.Masked() || p.String() != lit || p.Addr().Is4In6() {
			return "false" // never a key: the agent writes masked, canonical prefixes of unmapped addresses
		}
		if p.Addr().Is4() {
			return and("u_has_ip", "u_is4", bitsEq("u_ip4", 32, p.Addr().AsSlice(), p.Bits()))
		}
		return and("u_has_ip", "(not u_is4)", bitsEq("u_ip6", 128, p.Addr().AsSlice(), p.Bits()))
	case "port":
		b, l, ok := strings.Cut(lit, "/")
		base, err1 := strconv.Atoi(b)
		n, err2 := strconv.Atoi(l)
		if !ok || err1 != nil || err2 != nil || n < 0 || n > 16 || base < 0 || base > 65535 ||
			strconv.Itoa(base)+"/"+strconv.Itoa(n) != lit || base&(1<<(16-n)-1) != 0 {
			return "false"
		}
		return and(derivedPresent("port"), bitsEq("u_port", 16, []byte{byte(base >> 8), byte(base)}, n))
	}
	return "false"
}

// bitsEq: the top n bits of the width-bit variable v equal those of val.
func bitsEq(v string, width int, val []byte, n int) string {
	if n == 0 {
		return "true"
	}
	x := new(big.Int).SetBytes(val)
	x.Rsh(x, uint(width-n))
	return fmt.Sprintf("(= ((_ extract %d %d) %s) (_ bv%s %d))", width-1, width-n, v, x.String(), n)
}

// memberTerm: the string term t (not a literal) is a key of the derived
// set; only path and domain keys have a closed form.
func memberTerm(name, t string) (string, bool) {
	switch name {
	case "path":
		return and("u_has_path", or(eq(t, `"/"`), eq(t, "u_path"),
			and(`(not (= `+t+` ""))`, `(str.prefixof (str.++ `+t+` "/") u_path)`))), true
	case "domain":
		rest3 := `(str.substr ` + t + ` 3 (- (str.len ` + t + `) 3))`
		rest2 := `(str.substr ` + t + ` 2 (- (str.len ` + t + `) 2))`
		return and("u_has_dom", or(eq(t, "u_dom"),
			and(`(str.prefixof "**." `+t+`)`, or(eq(rest3, "u_dom"), `(str.suffixof (str.++ "." `+rest3+`) u_dom)`)),
			and(`(str.prefixof "*." `+t+`)`, `(str.suffixof (str.++ "." `+rest2+`) u_dom)`))), true
	}
	return "", false
}

// validDomain is the request-name grammar of reDomain.
func validDomain(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	for _, l := range strings.Split(d, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// valid says whether a model's path and name are ones the agent accepts.
func (r *Request) valid() bool {
	return (r.Path == "" || validPath(r.Path)) && (r.Domain == "" || validDomain(r.Domain))
}

func validPath(p string) bool {
	if p == "" || p[0] != '/' || p != cleanPath(p) {
		return false
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// readRequest builds the Request of a model.
func (e *enc) readRequest(vals map[string]string) (*Request, error) {
	var firstErr error
	str := func(v string) string {
		s, err := unSMTString(vals[v])
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return s
	}
	boo := func(v string) bool { return vals[v] == "true" }
	bv := func(v string) []byte {
		s := vals[v]
		x := new(big.Int)
		switch {
		case strings.HasPrefix(s, "#x"):
			x.SetString(s[2:], 16)
		case strings.HasPrefix(s, "#b"):
			x.SetString(s[2:], 2)
		default:
			if firstErr == nil {
				firstErr = fmt.Errorf("%w: bit-vector %s = %q", ErrSolver, v, s)
			}
		}
		return x.Bytes()
	}
	set := func(path string) []string {
		var out []string
		seen := map[string]bool{}
		for i := 0; i < e.slots[path]; i++ {
			b := fmt.Sprintf("%s_%d", freeSets[path], i)
			if boo(b+"_in") && !seen[str(b)] {
				seen[str(b)] = true
				out = append(out, str(b))
			}
		}
		return out
	}
	now, err := parseInt(vals["now"])
	if err != nil {
		return nil, err
	}
	r := &Request{Action: e.action, Class: str("r_class"), Now: time.UnixMilli(now).UTC(),
		Session: Session{ID: str("p_id"), Image: str("p_image"), TrustTier: str("p_trust"), Risk: str("p_risk"),
			Headless: boo("p_headless"), TLSInspection: boo("p_tls"), Protected: set("principal.protected"), PolicyStore: set("principal.policy_store")}}
	if e.action == "use" {
		r.Op, r.Item, r.Mode = str("u_op"), str("u_item"), str("u_mode")
		if boo("u_has_path") {
			r.Path = str("u_path")
		}
		if boo("u_has_dom") {
			r.Domain = str("u_dom")
		}
		if boo("u_has_ip") {
			if boo("u_is4") {
				r.IP = netip.AddrFrom4([4]byte(pad(bv("u_ip4"), 4)))
			} else {
				r.IP = netip.AddrFrom16([16]byte(pad(bv("u_ip6"), 16)))
			}
		}
		p := pad(bv("u_port"), 2)
		r.Port = uint16(p[0])<<8 | uint16(p[1])
	} else {
		r.Tier, r.Provenance, r.Lifecycle, r.ScopeMode = str("g_tier"), str("g_prov"), str("g_life"), str("g_mode")
		r.TLSInspect = boo("g_tls")
		r.WriteKeys, r.Flags = set("context.scope.write_keys"), set("context.scope.flags")
	}
	return r, firstErr
}

func pad(b []byte, n int) []byte {
	if len(b) >= n {
		return b[len(b)-n:]
	}
	return append(make([]byte, n-len(b)), b...)
}

func parseInt(s string) (int64, error) {
	neg := false
	if strings.HasPrefix(s, "(- ") {
		neg, s = true, strings.TrimSuffix(strings.TrimPrefix(s, "(- "), ")")
	}
	x, ok := new(big.Int).SetString(strings.TrimSpace(s), 10)
	if !ok {
		return 0, fmt.Errorf("%w: integer %q", ErrSolver, s)
	}
	if neg {
		x.Neg(x)
	}
	if !x.IsInt64() {
		return 0, fmt.Errorf("%w: integer %s out of range", ErrSolver, x)
	}
	return x.Int64(), nil
}
