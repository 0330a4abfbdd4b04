package agent

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/ast"
	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
	"github.com/cedar-policy/cedar-go/x/exp/schema"
	"github.com/cedar-policy/cedar-go/x/exp/schema/validate"
)

//go:embed policy/shinken.cedarschema policy/*.cedar
var shippedPolicy embed.FS

// Errors of the decision layer.
var (
	ErrPolicy         = errors.New("agent: invalid policy")
	ErrPolicyWidens   = errors.New("agent: policy edit widens authority")
	ErrUnknownSession = errors.New("agent: unknown session")
	ErrDenied         = errors.New("agent: denied by policy")
)

// Cedar names.
var (
	typeSession    = types.EntityType("Shinken::Session")
	typeCapability = types.EntityType("Shinken::Capability")
	typeGrant      = types.EntityType("Shinken::Grant")
	actionUse      = types.NewEntityUID("Shinken::Action", "use")
	actionGrant    = types.NewEntityUID("Shinken::Action", "grant")
	// farFuture stands for "never expires" in Cedar datetimes.
	farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
)

func sessionUID(id string) types.EntityUID { return types.NewEntityUID(typeSession, types.String(id)) }
func capabilityUID(c Class) types.EntityUID {
	return types.NewEntityUID(typeCapability, types.String(c))
}
func grantUID(id string) types.EntityUID { return types.NewEntityUID(typeGrant, types.String(id)) }

// PolicyError is one error at one place of one policy file.
type PolicyError struct {
	File   string
	Line   int
	Column int
	Msg    string
}

func (e *PolicyError) Error() string {
	if e.Column > 0 {
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}
func (e *PolicyError) Unwrap() error { return ErrPolicy }

// PolicyErrors is every error found in one policy set; it wraps ErrPolicy.
type PolicyErrors []*PolicyError

func (es PolicyErrors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}
func (es PolicyErrors) Unwrap() error { return ErrPolicy }

// SessionAttrs is what policies know about a session (the Session entity).
type SessionAttrs struct {
	ID            string
	Image         string
	TrustTier     string // low | normal | high
	Risk          string // normal | high
	Headless      bool
	TLSInspection bool
	Protected     []string // paths no write may touch
	PolicyStore   []string // the policy store: no write may touch it
}

func (s SessionAttrs) entity() types.Entity { return s.entityWith(nil) }

// entityWith builds the Session entity, sharing equal attribute values with
// other entities through in (nil: none shared).
func (s SessionAttrs) entityWith(in *interner) types.Entity {
	return types.Entity{
		UID: sessionUID(s.ID),
		Attributes: types.NewRecord(types.RecordMap{
			"image":          in.str(s.Image),
			"trust_tier":     in.str(s.TrustTier),
			"risk":           in.str(s.Risk),
			"headless":       types.Boolean(s.Headless),
			"tls_inspection": types.Boolean(s.TLSInspection),
			"protected":      in.set(s.Protected),
			"policy_store":   in.set(s.PolicyStore),
		}),
	}
}

// interner shares equal attribute values between the entities of an Engine:
// the boxed strings and small string sets that many grants and sessions hold
// (a class name, a mode, a flag set, the usual port blocks, a common domain).
// Cedar values are immutable, so sharing one is invisible to evaluation; a
// shared value stays in cache for every decision that reads it, and the heap
// holds it once. The tables stop growing at internMax entries each (values
// after that are simply not shared), so the memory they pin is bounded even
// as grants come and go. A nil *interner shares nothing. Not safe for
// concurrent use: the Engine calls it under its write lock.
type interner struct {
	strs map[string]types.Value
	sets map[string]types.Value
}

const (
	internMax    = 4096
	internMaxSet = 8   // elements
	internMaxLen = 256 // bytes, all elements together
)

func newInterner() *interner {
	return &interner{strs: map[string]types.Value{}, sets: map[string]types.Value{}}
}

func (in *interner) str(s string) types.Value {
	if in == nil || len(s) > internMaxLen {
		return types.String(s)
	}
	if v, ok := in.strs[s]; ok {
		return v
	}
	v := types.Value(types.String(s))
	if len(in.strs) < internMax {
		in.strs[s] = v
	}
	return v
}

func (in *interner) set(elems []string) types.Value {
	if len(elems) == 0 {
		return emptySetValue
	}
	if in == nil || len(elems) > internMaxSet {
		return stringSet(elems)
	}
	sorted := slices.Clone(elems)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	var key []byte
	for _, e := range sorted {
		key = strconv.AppendInt(key, int64(len(e)), 10) // length-prefixed: no element can forge a separator
		key = append(key, ':')
		key = append(key, e...)
	}
	if len(key) > internMaxLen {
		return stringSet(elems)
	}
	if v, ok := in.sets[string(key)]; ok {
		return v
	}
	v := types.Value(stringSet(elems))
	if len(in.sets) < internMax {
		in.sets[string(key)] = v
	}
	return v
}

var (
	emptySet                  = types.NewSet()
	emptySetValue types.Value = emptySet
)

func stringSet(s []string) types.Set {
	if len(s) == 0 {
		return emptySet
	}
	var buf [32]types.Value // NewSet keeps the values, not the slice
	v := buf[:0]
	for _, x := range s {
		v = append(v, types.String(x))
	}
	return types.NewSet(v...)
}

// GrantData is what the decision layer holds of one live grant.
type GrantData struct {
	ID         string
	Session    string
	Capability Capability
	Expires    time.Time // zero: never
}

// grantEntity turns a grant's scope into entity data: set-valued attributes
// the class's fixed policy reads with containsAny against the request keys.
func grantEntity(g GrantData) types.Entity { return grantEntityWith(g, nil, nil) }

// grantEntityWith builds the Grant entity, sharing equal attribute values with
// other entities through in (nil: none shared); session, when not nil, is
// the grant's session UID already boxed.
func grantEntityWith(g GrantData, in *interner, session types.Value) types.Entity {
	if session == nil {
		session = sessionUID(g.Session)
	}
	c := g.Capability.Normalized()
	exp := g.Expires
	if exp.IsZero() {
		exp = farFuture
	}
	var domains, cidrs, ports, read, write, deny, flags, items []string
	mode := ""
	setFlag := func(name string, on bool) {
		if on {
			flags = append(flags, name)
		}
	}
	switch c.Class {
	case ClassNetEgress:
		domains = c.Egress.Domains
		for _, p := range c.Egress.CIDRs {
			cidrs = append(cidrs, p.String())
		}
		ports = portBlocks(c.Egress.Ports)
		setFlag("tls_inspect", c.Egress.TLSInspect)
	case ClassFSScope:
		read, write, deny = c.FS.Read, c.FS.Write, c.FS.Deny
	case ClassClipboard:
		setFlag("paste_in", c.Clipboard.PasteIn)
		setFlag("copy_out", c.Clipboard.CopyOut)
	case ClassGPU:
		items, mode = c.GPU.DeviceIDs, c.GPU.Mode
	case ClassInstall:
		mode = c.Install.Scope
	case ClassPersistence:
		write = c.Persistence.Paths
		setFlag("survives_session", c.Persistence.SurvivesSession)
	case ClassCredentials:
		items = c.Credentials.BrokerScopes
	case ClassPeripheral:
		setFlag("camera", c.Peripheral.Camera)
		setFlag("mic", c.Peripheral.Mic)
		setFlag("input_inject", c.Peripheral.InputInject)
		items = c.Peripheral.USB
	}
	return types.Entity{
		UID: grantUID(g.ID),
		Attributes: types.NewRecord(types.RecordMap{
			"session": session,
			"class":   in.str(string(c.Class)),
			"expires": types.NewDatetime(exp),
			"domains": in.set(domains),
			"cidrs":   in.set(cidrs),
			"ports":   in.set(ports),
			"read":    in.set(read),
			"write":   in.set(write),
			"deny":    in.set(deny),
			"flags":   in.set(flags),
			"items":   in.set(items),
			"mode":    in.str(mode),
		}),
	}
}

// grantCondition is the condition of the fixed policy of a grant's class,
// over the grant entity G: the policy names only agent-made identifiers; every
// user value (domain, prefix, path, ...) stays in the Grant entity's data.
func grantCondition(class Class, G ast.Node) ast.Node {
	ctx := ast.Context()
	req := ctx.Access("request")
	op := req.Access("op")
	live := ctx.Access("now").LessThan(G.Access("expires"))
	var cond ast.Node
	switch class {
	case ClassNetEgress:
		cond = op.Equal(ast.String("connect")).
			And(G.Access("domains").ContainsAny(req.Access("domain_keys")).Or(G.Access("cidrs").ContainsAny(req.Access("cidr_keys")))).
			And(G.Access("ports").ContainsAny(req.Access("port_keys")))
	case ClassFSScope:
		cond = op.Equal(ast.String("read")).And(G.Access("read").ContainsAny(req.Access("path_keys"))).
			Or(op.Equal(ast.String("write")).And(G.Access("write").ContainsAny(req.Access("path_keys")))).
			And(ast.Not(G.Access("deny").ContainsAny(req.Access("path_keys"))))
	case ClassClipboard:
		cond = G.Access("flags").Contains(op).And(op.Equal(ast.String("paste_in")).Or(op.Equal(ast.String("copy_out"))))
	case ClassGPU:
		cond = op.Equal(ast.String("use")).And(G.Access("items").Contains(req.Access("item"))).And(G.Access("mode").Equal(req.Access("mode")))
	case ClassInstall:
		cond = op.Equal(ast.String("pkg")).Or(op.Equal(ast.String("any"))).
			And(G.Access("mode").Equal(ast.String("any")).Or(G.Access("mode").Equal(op)))
	case ClassPersistence:
		cond = op.Equal(ast.String("persist")).And(G.Access("write").ContainsAny(req.Access("path_keys")))
	case ClassCredentials:
		cond = op.Equal(ast.String("broker")).And(G.Access("items").Contains(req.Access("item")))
	case ClassPeripheral:
		cond = op.Equal(ast.String("usb")).And(G.Access("items").Contains(req.Access("item"))).
			Or(op.NotEqual(ast.String("usb")).And(G.Access("flags").Contains(op)).
				And(op.Equal(ast.String("camera")).Or(op.Equal(ast.String("mic"))).Or(op.Equal(ast.String("input_inject")))))
	default:
		cond = ast.False()
	}
	return live.And(cond)
}

// grantPolicy builds the fixed policy of the grant's class, linked to the
// session and the grant entity through cedar-go's AST. This is the
// template-link Cedar would do with ?principal/?resource slots, which cedar-go
// does not have. Decide evaluates the same template once per class with the
// grant bound at evaluation time (grantTemplate); this linked form is what
// ProveGrant checks and what the flat set holds.
func grantPolicy(g GrantData) *cedar.Policy {
	return linkedGrantPolicy(g.ID, g.Session, g.Capability.Class)
}

func linkedGrantPolicy(id, session string, class Class) *cedar.Policy {
	p := ast.Permit().
		Annotate("id", types.String("grant:"+id)).
		PrincipalEq(sessionUID(session)).
		ActionEq(actionUse).
		ResourceEq(capabilityUID(class)).
		When(grantCondition(class, ast.Value(grantUID(id))))
	return cedar.NewPolicyFromAST(p)
}

// boundGrantID is the grant slot of the shared templates: the entity
// Shinken::Grant::"?grant" stands for whichever grant a decision is
// evaluating. Minted grant ids are hex, so no real grant has this id.
const boundGrantID = "?grant"

var boundGrantUID = grantUID(boundGrantID)

// grantTemplate is the fixed policy of a class with the grant left as the
// slot boundGrantUID. Decide evaluates it once per grant of the asking
// session's class, with the slot bound to that grant's entity (sessionView),
// so one compiled policy per class serves every grant: the linked form
// (grantPolicy) only adds "principal == <the grant's session>", which holds
// by construction since a session's decision binds that session's grants
// only.
func grantTemplate(class Class) *cedar.Policy {
	p := ast.Permit().
		Annotate("id", types.String("grant:"+boundGrantID)).
		ActionEq(actionUse).
		ResourceEq(capabilityUID(class)).
		When(grantCondition(class, ast.Value(boundGrantUID)))
	return cedar.NewPolicyFromAST(p)
}

// UseRequest is one use-time question: may the session do this now?
type UseRequest struct {
	Class  Class      `json:"class"`
	Op     string     `json:"op"`               // connect | read | write | paste_in | copy_out | use | pkg | any | persist | broker | camera | mic | usb | input_inject
	Domain string     `json:"domain,omitempty"` // net.egress by name
	IP     netip.Addr `json:"ip,omitzero"`      // net.egress by address
	Port   uint16     `json:"port,omitempty"`
	Path   string     `json:"path,omitempty"`
	Item   string     `json:"item,omitempty"` // gpu device, broker scope, usb id
	Mode   string     `json:"mode,omitempty"` // gpu mode
}

// Validate checks the request's shape.
func (r UseRequest) Validate() error {
	if _, err := ParseClass(string(r.Class)); err != nil {
		return err
	}
	if r.Op == "" {
		return fmt.Errorf("%w: request without op", ErrInvalidCapability)
	}
	if r.Path != "" {
		if err := validatePath(r.Path); err != nil {
			return err
		}
	}
	if r.Domain != "" {
		if err := validateDomainPattern(r.Domain); err != nil || strings.HasPrefix(r.Domain, "*") {
			return fmt.Errorf("%w: request domain %q", ErrInvalidCapability, r.Domain)
		}
	}
	return nil
}

// keyLens says which prefix lengths of the request's address and port the
// policies can ever compare against: the lengths named by the base policies'
// literals and by the session's grants. Request keys at other lengths can
// match nothing, so they are not built (nil keyLens: build all).
type keyLens struct {
	v4   uint64
	v6   [3]uint64
	port uint32
}

func (k *keyLens) addPrefix(p netip.Prefix) {
	if p.Addr().Is4() {
		k.v4 |= 1 << p.Bits()
	} else {
		k.v6[p.Bits()/64] |= 1 << (p.Bits() % 64)
	}
}

func (k *keyLens) addPortBlock(s string) {
	_, l, ok := strings.Cut(s, "/")
	if n, err := strconv.Atoi(l); ok && err == nil && n >= 0 && n <= 16 {
		k.port |= 1 << n
	}
}

func (k keyLens) union(o keyLens) keyLens {
	k.v4 |= o.v4
	for i := range k.v6 {
		k.v6[i] |= o.v6[i]
	}
	k.port |= o.port
	return k
}

func (k *keyLens) has(a netip.Addr, bits int) bool {
	if k == nil {
		return true
	}
	if a.Is4() {
		return k.v4&(1<<bits) != 0
	}
	return k.v6[bits/64]&(1<<(bits%64)) != 0
}

func (r UseRequest) context(now time.Time) types.Record { return r.contextLens(now, nil) }

func (r UseRequest) contextLens(now time.Time, lens *keyLens) types.Record {
	// Empty key sets are the one boxed empty set: boxing a Set allocates.
	pathKeys, domainKeys, cidrKeys, portKeys := emptySetValue, emptySetValue, emptySetValue, emptySetValue
	if r.Path != "" {
		pathKeys = stringSet(pathAncestors(r.Path))
	}
	if r.Domain != "" {
		domainKeys = stringSet(domainKeysOf(strings.ToLower(r.Domain)))
	}
	if r.IP.IsValid() {
		cidrKeys = stringSet(cidrKeysOf(r.IP.Unmap(), lens))
	}
	if r.Class == ClassNetEgress {
		portKeys = stringSet(portKeysOf(r.Port, lens))
	}
	return types.NewRecord(types.RecordMap{
		"now": types.NewDatetime(now),
		"request": types.NewRecord(types.RecordMap{
			"op":          opValue(r.Op),
			"path_keys":   pathKeys,
			"domain_keys": domainKeys,
			"cidr_keys":   cidrKeys,
			"port_keys":   portKeys,
			"item":        types.String(r.Item),
			"mode":        types.String(r.Mode),
		}),
	})
}

// opValues are the request ops as Cedar values, boxed once (a decision
// would otherwise allocate one).
var opValues = func() map[string]types.Value {
	m := map[string]types.Value{}
	for _, op := range []string{"connect", "read", "write", "paste_in", "copy_out", "use", "pkg", "any", "persist", "broker", "camera", "mic", "usb", "input_inject"} {
		m[op] = types.String(op)
	}
	return m
}()

func opValue(op string) types.Value {
	if v, ok := opValues[op]; ok {
		return v
	}
	return types.String(op)
}

// The request keys below are substrings of one buffer per kind: one string
// allocation instead of one per key.

// pathAncestors returns p and every ancestor up to "/".
func pathAncestors(p string) []string {
	out := make([]string, 1, strings.Count(p, "/")+1)
	out[0] = p
	for p != "/" {
		p = filepath.Dir(p)
		out = append(out, p)
	}
	return out
}

// domainKeysOf returns the keys a grant's domain patterns are matched with:
// d, "**."+d, and "*."+s and "**."+s for every proper suffix s of d.
func domainKeysOf(d string) []string {
	n := strings.Count(d, ".")
	// buf holds "**."+s for s = d and each proper suffix; "*."+s is its tail.
	b := make([]byte, 0, (n+1)*3+len(d)*(n+1))
	for s := d; ; {
		b = append(b, "**."...)
		b = append(b, s...)
		_, rest, ok := strings.Cut(s, ".")
		if !ok {
			break
		}
		s = rest
	}
	buf := string(b)
	out := make([]string, 0, 2+2*n)
	off := 0
	for i, s := 0, d; ; i++ {
		key := buf[off : off+3+len(s)] // "**."+s
		off += len(key)
		if i == 0 {
			out = append(out, key[3:], key)
		} else {
			out = append(out, key[1:], key)
		}
		_, rest, ok := strings.Cut(s, ".")
		if !ok {
			break
		}
		s = rest
	}
	return out
}

func cidrKeysOf(a netip.Addr, lens *keyLens) []string {
	var b []byte
	var ends [129]int
	n := 0
	for bits := a.BitLen(); bits >= 0; bits-- {
		if !lens.has(a, bits) {
			continue
		}
		p, _ := a.Prefix(bits)
		b = p.AppendTo(b)
		ends[n] = len(b)
		n++
	}
	return splitAt(b, ends[:n])
}

// splitAt cuts b at the given end offsets into strings that share one
// allocation.
func splitAt(b []byte, ends []int) []string {
	buf := string(b)
	out := make([]string, len(ends))
	start := 0
	for i, end := range ends {
		out[i] = buf[start:end]
		start = end
	}
	return out
}

// portKeysOf returns the aligned blocks "base/len" covering port p (all 17,
// or those at the lengths lens names).
func portKeysOf(p uint16, lens *keyLens) []string {
	var arr [17 * 8]byte
	b := arr[:0]
	var ends [17]int
	n := 0
	for l := 16; l >= 0; l-- {
		if lens != nil && lens.port&(1<<l) == 0 {
			continue
		}
		base := uint32(p) >> (16 - l) << (16 - l)
		b = strconv.AppendUint(b, uint64(base), 10)
		b = append(b, '/')
		b = strconv.AppendUint(b, uint64(l), 10)
		ends[n] = len(b)
		n++
	}
	return splitAt(b, ends[:n])
}

// portBlocks decomposes port ranges into aligned blocks (as a range becomes
// CIDRs); no ranges means every port ("0/0").
func portBlocks(rs []PortRange) []string {
	if len(rs) == 0 {
		return []string{"0/0"}
	}
	var out []string
	for _, r := range rs {
		lo, hi := uint32(r.Lo), uint32(r.Hi)
		for lo <= hi {
			size := uint32(1) << bits.TrailingZeros32(lo|1<<16)
			for lo+size-1 > hi {
				size >>= 1
			}
			out = append(out, strconv.Itoa(int(lo))+"/"+strconv.Itoa(16-bits.TrailingZeros32(size)))
			lo += size
		}
	}
	return sortedUnique(out)
}

// Decision is the answer to one request.
type Decision struct {
	Allowed bool     `json:"allowed"`
	Reasons []string `json:"reasons,omitempty"` // the policies that decided (forbids when denied)
	Errors  []string `json:"errors,omitempty"`  // policies that failed to evaluate (skipped, as Cedar does)
}

type policyBase struct {
	policies cedar.PolicyMap
	where    map[cedar.PolicyID]string // "file:line"
	files    []string
	lens     keyLens // address and port key lengths its literals name
	// useByClass slices the set for "use" requests by resource class (by
	// classIndex): a policy whose scope names another action or another
	// Capability cannot match, so it is left out (policies with any other
	// scope shape are in every slice). Evaluating a slice gives exactly the
	// full set's answer.
	useByClass [nClasses][]policyEntry
}

// policyEntry is one policy of a slice, with its id.
type policyEntry struct {
	id     cedar.PolicyID
	policy *cedar.Policy
}

// nClasses is len(Classes); per-class tables are arrays indexed by classIndex.
const nClasses = 8

func init() {
	if len(Classes) != nClasses {
		panic("agent: nClasses != len(Classes)")
	}
}

// classIndex is c's position in Classes, or -1.
func classIndex(c Class) int {
	for i, x := range Classes {
		if x == c {
			return i
		}
	}
	return -1
}

// slice fills useByClass from the policies' scopes.
func (b *policyBase) slice() {
	add := func(i int, id cedar.PolicyID, p *cedar.Policy) {
		b.useByClass[i] = append(b.useByClass[i], policyEntry{id, p})
	}
	for id, p := range b.policies {
		a := (*xast.Policy)(p.AST())
		if sc, ok := a.Action.(xast.ScopeTypeEq); ok && sc.Entity != actionUse {
			continue
		}
		if sc, ok := a.Resource.(xast.ScopeTypeEq); ok {
			if sc.Entity.Type != typeCapability {
				continue
			}
			if i := classIndex(Class(sc.Entity.ID)); i >= 0 {
				add(i, id, p)
			}
			continue
		}
		for i := range b.useByClass {
			add(i, id, p)
		}
	}
	for i := range b.useByClass {
		slices.SortFunc(b.useByClass[i], func(x, y policyEntry) int { return strings.Compare(string(x.id), string(y.id)) })
	}
}

// boundGrant is one grant of a session as Decide binds it to its class's
// template.
type boundGrant struct {
	policy cedar.PolicyID // "grant:<id>": the id of the grant's (linked) policy
	id     string
	ent    types.Entity
	// keys says which request key kinds can satisfy the grant's
	// "domain or address" part (net.egress only): keyDomain when its domains
	// set is not empty, keyAddr when its cidrs set is not empty.
	keys keyKinds
}

// keyKinds is a set of request key kinds.
type keyKinds uint8

const (
	keyDomain keyKinds = 1 << iota
	keyAddr
)

// egressKeys is what a net.egress grant entity can match: its template
// requires domains ∩ domain_keys ≠ ∅ or cidrs ∩ cidr_keys ≠ ∅, so a grant
// whose kinds share none with the request's evaluates to false.
func egressKeys(ent types.Entity) keyKinds {
	var k keyKinds
	if v, ok := ent.Attributes.Get("domains"); ok && v.(types.Set).Len() > 0 {
		k |= keyDomain
	}
	if v, ok := ent.Attributes.Get("cidrs"); ok && v.(types.Set).Len() > 0 {
		k |= keyAddr
	}
	return k
}

// requestKeys is the key kinds a request carries (a domain, an address).
func requestKeys(r UseRequest) keyKinds {
	var k keyKinds
	if r.Domain != "" {
		k |= keyDomain
	}
	if r.IP.IsValid() {
		k |= keyAddr
	}
	return k
}

// sessionSet is one session's decision data. It is never modified once
// published in Engine.sessions (updates build a new one), so a decision reads
// it without holding the lock.
type sessionSet struct {
	uid      types.EntityUID
	uidValue types.Value     // uid, boxed once for its grants' "session"
	entity   types.Entity    // the Session entity
	entities types.EntityMap // the Session entity and the grants' entities
	lens     keyLens         // address and port key lengths its grants name
	byClass  [nClasses][]boundGrant
}

// index rebuilds byClass from the grant entities (in grant id order).
func (s *sessionSet) index() {
	s.byClass = [nClasses][]boundGrant{}
	for uid, ent := range s.entities {
		if uid.Type != typeGrant {
			continue
		}
		v, _ := ent.Attributes.Get("class")
		i := classIndex(Class(v.(types.String)))
		if i < 0 {
			continue
		}
		id := string(uid.ID)
		b := boundGrant{policy: cedar.PolicyID("grant:" + id), id: id, ent: ent}
		if Classes[i] == ClassNetEgress {
			b.keys = egressKeys(ent)
		}
		s.byClass[i] = append(s.byClass[i], b)
	}
	for i := range s.byClass {
		slices.SortFunc(s.byClass[i], func(x, y boundGrant) int { return strings.Compare(x.id, y.id) })
	}
}

// sessionView is what one decision evaluates: the base slice for the
// request's class, then the class's template once per grant of that class,
// with the grant slot (boundGrantUID) bound to that grant's entity while its
// turn is evaluated. Authorize evaluates each policy the iterator yields before
// the iterator resumes, so the binding is that of the policy being
// evaluated. It is the policy set and the entity store of the request.
//
// For net.egress it leaves out the grants whose template is false for every
// request with the request's key kinds (a domain-only grant for an address
// request, and the reverse), as the base slice leaves out policies whose
// scope cannot match: the template cannot fail on a grant entity (every
// attribute is present and typed), so the decision, its reasons and its
// errors are those of the full set (TestDecideMatchesFlatSet).
type sessionView struct {
	s      *sessionSet
	base   []policyEntry
	tmpl   *cedar.Policy
	grants []boundGrant
	bound  *types.Entity
	keys   keyKinds // the request's key kinds (net.egress); 0: no filtering
}

func (v *sessionView) All() iter.Seq2[cedar.PolicyID, *cedar.Policy] {
	return func(yield func(cedar.PolicyID, *cedar.Policy) bool) {
		for _, p := range v.base {
			if !yield(p.id, p.policy) {
				return
			}
		}
		for i := range v.grants {
			if v.keys != 0 && v.grants[i].keys&v.keys == 0 {
				continue
			}
			v.bound = &v.grants[i].ent
			ok := yield(v.grants[i].policy, v.tmpl)
			v.bound = nil
			if !ok {
				return
			}
		}
	}
}

func (v *sessionView) Get(uid types.EntityUID) (types.Entity, bool) {
	if uid == boundGrantUID {
		if v.bound == nil {
			return types.Entity{}, false
		}
		return *v.bound, true
	}
	if uid == v.s.uid {
		return v.s.entity, true
	}
	return v.s.entities.Get(uid)
}

func (s *sessionSet) computeLens() {
	s.lens = keyLens{}
	for uid, ent := range s.entities {
		if uid.Type != typeGrant {
			continue
		}
		if v, ok := ent.Attributes.Get("cidrs"); ok {
			for x := range v.(types.Set).All() {
				if p, err := netip.ParsePrefix(string(x.(types.String))); err == nil {
					s.lens.addPrefix(p)
				}
			}
		}
		if v, ok := ent.Attributes.Get("ports"); ok {
			for x := range v.(types.Set).All() {
				s.lens.addPortBlock(string(x.(types.String)))
			}
		}
	}
}

// Engine is the decision layer: the shipped base policies, the policy
// directory's policies, and per session the Session entity and its grants'
// policies and entities. A decision evaluates the base set plus the asking
// session's grants only, so its cost does not grow with the number of
// sessions on the host.
type Engine struct {
	validator *validate.Validator
	base      atomic.Pointer[policyBase]
	dir       string
	templates [nClasses]*cedar.Policy // grantTemplate per class, by classIndex

	mu       sync.RWMutex
	sessions map[string]*sessionSet
	intern   *interner // under mu
}

// NewEngine loads the schema and the shipped policies, then the *.cedar files
// of policyDir when it is not empty.
func NewEngine(policyDir string) (*Engine, error) {
	src, err := shippedPolicy.ReadFile("policy/shinken.cedarschema")
	if err != nil {
		return nil, err
	}
	var s schema.Schema
	s.SetFilename("shinken.cedarschema")
	if err := s.UnmarshalCedar(src); err != nil {
		return nil, fmt.Errorf("%w: shipped schema: %w", ErrPolicy, err)
	}
	rs, err := s.Resolve()
	if err != nil {
		return nil, fmt.Errorf("%w: shipped schema: %w", ErrPolicy, err)
	}
	e := &Engine{validator: validate.New(rs), sessions: map[string]*sessionSet{}, dir: policyDir, intern: newInterner()}
	// The per-grant templates must type-check against the schema; catch drift
	// at start rather than at the first grant.
	for i, c := range Classes {
		p := grantPolicy(GrantData{ID: "probe", Session: "probe", Capability: Empty(c)})
		if err := e.validator.Policy("grant template "+string(c), (*xast.Policy)(p.AST())); err != nil {
			return nil, fmt.Errorf("%w: grant template for %s: %w", ErrPolicy, c, err)
		}
		e.templates[i] = grantTemplate(c)
		if err := e.validator.Policy("grant template "+string(c), (*xast.Policy)(e.templates[i].AST())); err != nil {
			return nil, fmt.Errorf("%w: grant template for %s: %w", ErrPolicy, c, err)
		}
	}
	b, err := e.load(policyDir)
	if err != nil {
		return nil, err
	}
	e.base.Store(b)
	return e, nil
}

var inputPosRE = regexp.MustCompile(`<input>:(\d+):(\d+):?\s*`)

// parseFile parses and validates one policy file; errors carry file:line.
func (e *Engine) parseFile(name string, data []byte, b *policyBase, errs *PolicyErrors) {
	list, err := cedar.NewPolicyListFromBytes(name, data)
	if err != nil {
		pe := &PolicyError{File: name, Line: 1, Msg: err.Error()}
		if m := inputPosRE.FindStringSubmatchIndex(err.Error()); m != nil {
			msg := err.Error()
			pe.Line, _ = strconv.Atoi(msg[m[2]:m[3]])
			pe.Column, _ = strconv.Atoi(msg[m[4]:m[5]])
			pe.Msg = strings.TrimSpace(strings.TrimPrefix(msg[:m[0]]+msg[m[1]:], "parser error: parse error at "))
		}
		*errs = append(*errs, pe)
		return
	}
	for i, p := range list {
		pos := p.Position()
		id := cedar.PolicyID(fmt.Sprintf("%s#%d", name, i))
		if v, ok := p.Annotations()["id"]; ok {
			id = cedar.PolicyID(v)
		}
		if strings.HasPrefix(string(id), "grant:") {
			*errs = append(*errs, &PolicyError{File: name, Line: pos.Line, Column: pos.Column, Msg: fmt.Sprintf("policy id %q: the grant: prefix is reserved for per-grant policies", id)})
			continue
		}
		if prev, dup := b.where[id]; dup {
			*errs = append(*errs, &PolicyError{File: name, Line: pos.Line, Column: pos.Column, Msg: fmt.Sprintf("policy id %q already used at %s", id, prev)})
			continue
		}
		if err := e.validator.Policy(string(id), (*xast.Policy)(p.AST())); err != nil {
			for _, m := range strings.Split(err.Error(), "\n") {
				*errs = append(*errs, &PolicyError{File: name, Line: pos.Line, Column: pos.Column, Msg: m})
			}
			continue
		}
		b.policies[id] = p
		b.where[id] = fmt.Sprintf("%s:%d", name, pos.Line)
	}
	b.files = append(b.files, name)
}

// load builds the base set: shipped policies, then the directory's.
func (e *Engine) load(dir string) (*policyBase, error) {
	b := &policyBase{policies: cedar.PolicyMap{}, where: map[cedar.PolicyID]string{}}
	var errs PolicyErrors
	shipped, _ := fs.Glob(shippedPolicy, "policy/*.cedar")
	slices.Sort(shipped)
	for _, f := range shipped {
		data, _ := shippedPolicy.ReadFile(f)
		e.parseFile("shipped/"+filepath.Base(f), data, b, &errs)
	}
	if dir != "" {
		files, err := filepath.Glob(filepath.Join(dir, "*.cedar"))
		if err != nil {
			return nil, fmt.Errorf("%w: policy directory %s: %w", ErrPolicy, dir, err)
		}
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("%w: policy directory: %w", ErrPolicy, err)
		}
		slices.Sort(files)
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				errs = append(errs, &PolicyError{File: f, Line: 0, Msg: err.Error()})
				continue
			}
			e.parseFile(f, data, b, &errs)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	var lit literals
	for _, p := range b.policies {
		lit.collect(p)
	}
	for _, p := range lit.ips {
		b.lens.addPrefix(p)
	}
	for _, s := range lit.strs {
		b.lens.addPortBlock(s)
	}
	b.slice()
	return b, nil
}

// ReloadOptions controls a policy directory reload.
type ReloadOptions struct {
	// AllowWiden accepts an edit the permissiveness check found widening
	// (an operator adding a standing grant on purpose). The counterexample is
	// still returned in the report.
	AllowWiden bool
}

// Reload re-reads the policy directory. A directory that does not parse or
// validate is rejected with every file:line error and the previous set stays
// in force; so does one that widens authority (ErrPolicyWidens, with a
// concrete counterexample) unless opts.AllowWiden.
func (e *Engine) Reload(opts ReloadOptions) (*ShiftReport, error) {
	nb, err := e.load(e.dir)
	if err != nil {
		return nil, err
	}
	old := e.base.Load()
	rep := e.CheckShift(old.policies, nb.policies)
	if rep.Widens() && !opts.AllowWiden {
		return rep, fmt.Errorf("%w: %s", ErrPolicyWidens, rep.Counterexample)
	}
	e.base.Store(nb)
	return rep, nil
}

// PolicyIDs lists the base set's policy ids with their file:line.
func (e *Engine) PolicyIDs() map[string]string {
	out := map[string]string{}
	for id, w := range e.base.Load().where {
		out[string(id)] = w
	}
	return out
}

// PutSession adds or replaces a session's entity, keeping its grants.
func (e *Engine) PutSession(s SessionAttrs) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.sessions[s.ID]
	ns := &sessionSet{entities: types.EntityMap{}}
	if old != nil {
		ns.entities = old.entities.Clone()
		ns.lens = old.lens
		ns.byClass = old.byClass
	}
	ns.uid = sessionUID(s.ID)
	ns.uidValue = ns.uid
	ns.entity = s.entityWith(e.intern)
	ns.entities[ns.uid] = ns.entity
	e.sessions[s.ID] = ns
}

// DropSession forgets a session and its grants.
func (e *Engine) DropSession(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.sessions, id)
}

// PutGrant installs a grant's entity and policy for its session.
func (e *Engine) PutGrant(g GrantData) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.sessions[g.Session]
	if old == nil {
		return fmt.Errorf("%w: %q", ErrUnknownSession, g.Session)
	}
	if g.ID == boundGrantID {
		return fmt.Errorf("%w: grant id %q is reserved", ErrInvalidCapability, g.ID)
	}
	ns := &sessionSet{uid: old.uid, uidValue: old.uidValue, entity: old.entity, entities: old.entities.Clone()}
	ns.entities[grantUID(g.ID)] = grantEntityWith(g, e.intern, old.uidValue)
	ns.computeLens()
	ns.index()
	e.sessions[g.Session] = ns
	return nil
}

// RemoveGrant removes a grant's policy and entity (idempotent).
func (e *Engine) RemoveGrant(session, id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.sessions[session]
	if old == nil {
		return
	}
	ns := &sessionSet{uid: old.uid, uidValue: old.uidValue, entity: old.entity, entities: old.entities.Clone()}
	delete(ns.entities, grantUID(id))
	ns.computeLens()
	ns.index()
	e.sessions[session] = ns
}

func maps2(m cedar.PolicyMap) cedar.PolicyMap {
	out := make(cedar.PolicyMap, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (e *Engine) session(id string) (*sessionSet, error) {
	e.mu.RLock()
	s := e.sessions[id]
	e.mu.RUnlock()
	if s == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownSession, id)
	}
	return s, nil
}

func decision(d cedar.Decision, diag cedar.Diagnostic) Decision {
	out := Decision{Allowed: d == cedar.Allow}
	for _, r := range diag.Reasons {
		out.Reasons = append(out.Reasons, string(r.PolicyID))
	}
	for _, er := range diag.Errors {
		out.Errors = append(out.Errors, string(er.PolicyID)+": "+er.Message)
	}
	return out
}

// Decide answers a use-time request for a session: base policies plus that
// session's grants. An unknown session is denied (with ErrUnknownSession).
func (e *Engine) Decide(session string, r UseRequest, now time.Time) (Decision, error) {
	if err := r.Validate(); err != nil {
		return Decision{}, err
	}
	s, err := e.session(session)
	if err != nil {
		return Decision{}, err
	}
	base := e.base.Load()
	ci := classIndex(r.Class)
	lens := base.lens.union(s.lens)
	v := &sessionView{s: s, base: base.useByClass[ci], tmpl: e.templates[ci], grants: s.byClass[ci]}
	if r.Class == ClassNetEgress {
		v.keys = requestKeys(r)
		if v.keys == 0 {
			v.grants = nil // no domain and no address: no egress grant can match
		}
	}
	d, diag := cedar.Authorize(v, v, cedar.Request{
		Principal: sessionUID(session),
		Action:    actionUse,
		Resource:  capabilityUID(r.Class),
		Context:   r.contextLens(now, &lens),
	})
	return decision(d, diag), nil
}

// Lifecycle says how long a grant lives (seeds/permissions.md §6.3).
type Lifecycle string

const (
	LifecycleOnce     Lifecycle = "once"     // one action; dies after its first use (or its short TTL)
	LifecycleSession  Lifecycle = "session"  // until the session ends (or the TTL)
	LifecycleStanding Lifecycle = "standing" // admin policy only; never issued in-session
)

// grantScope summarizes a capability for the grant-time base policies.
func grantScope(c Capability) types.Record {
	c = c.Normalized()
	var writes []string
	var flags []string
	mode := ""
	tls := false
	switch c.Class {
	case ClassFSScope:
		for _, p := range c.FS.Write {
			writes = append(writes, pathAncestors(p)...)
		}
	case ClassPersistence:
		for _, p := range c.Persistence.Paths {
			writes = append(writes, pathAncestors(p)...)
		}
	case ClassNetEgress:
		tls = c.Egress.TLSInspect
	case ClassGPU:
		mode = c.GPU.Mode
	case ClassInstall:
		mode = c.Install.Scope
	}
	return types.NewRecord(types.RecordMap{
		"write_keys":  stringSet(sortedUnique(writes)),
		"tls_inspect": types.Boolean(tls),
		"mode":        types.String(mode),
		"flags":       stringSet(flags),
	})
}

// AuthorizeGrant is step 1 of GRANT: may this session be granted c at this
// tier? Only the base set decides (a session's own grants never permit a new
// grant).
func (e *Engine) AuthorizeGrant(session string, c Capability, tier Tier, p Provenance, lc Lifecycle, now time.Time) (Decision, error) {
	s, err := e.session(session)
	if err != nil {
		return Decision{}, err
	}
	d, diag := cedar.Authorize(e.base.Load().policies, s.entities, cedar.Request{
		Principal: sessionUID(session),
		Action:    actionGrant,
		Resource:  capabilityUID(c.Class),
		Context: types.NewRecord(types.RecordMap{
			"now":        types.NewDatetime(now),
			"tier":       types.String(tier.String()),
			"provenance": types.String(string(p)),
			"lifecycle":  types.String(string(lc)),
			"scope":      grantScope(c),
		}),
	})
	return decision(d, diag), nil
}

// CedarRequest is the Cedar request Decide evaluates for a use-time request.
func CedarRequest(session string, r UseRequest, now time.Time) cedar.Request {
	return cedar.Request{Principal: sessionUID(session), Action: actionUse, Resource: capabilityUID(r.Class), Context: r.context(now)}
}

// Flatten returns one policy set holding the base policies and every
// session's grant policies, with one entity map holding every session and
// grant: the "one flat policy set" a decision would evaluate without the
// per-session split. Evaluating it gives the same answers as Decide; it
// exists to measure what the split saves (bench/decision).
func (e *Engine) Flatten() (cedar.PolicyMap, types.EntityMap) {
	pm := maps2(e.base.Load().policies)
	em := types.EntityMap{}
	e.mu.RLock()
	defer e.mu.RUnlock()
	for _, s := range e.sessions {
		for i, gs := range s.byClass {
			for _, g := range gs {
				pm[g.policy] = linkedGrantPolicy(g.id, string(s.uid.ID), Classes[i])
			}
		}
		for k, v := range s.entities {
			em[k] = v
		}
	}
	return pm, em
}
