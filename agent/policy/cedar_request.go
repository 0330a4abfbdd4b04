package policy

// Decision layer: request encoding. A use-time request (UseRequest) becomes a
// Cedar context of precomputed keys (path ancestors, domain suffixes, covering
// prefixes, aligned port blocks), since Cedar has no quantifiers; grantScope
// summarizes a capability for the grant-time policies.

import (
	"math/bits"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/capability"
)

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

func useContext(r capability.UseRequest, now time.Time) types.Record {
	return useContextLens(r, now, nil)
}

func useContextLens(r capability.UseRequest, now time.Time, lens *keyLens) types.Record {
	return useContextMemo(r, now, lens, nil)
}

// keyMemo keeps the key sets already built for one series of requests
// (ProveGrant's probes share a few addresses, ports and domains): a set is
// built once per value instead of once per request. Only for full key sets
// (no lens).
type keyMemo struct {
	cidr   map[netip.Addr]types.Value
	port   map[uint16]types.Value
	domain map[string]types.Value
}

var noMemo keyMemo

func newKeyMemo() *keyMemo {
	return &keyMemo{cidr: map[netip.Addr]types.Value{}, port: map[uint16]types.Value{}, domain: map[string]types.Value{}}
}

func memoized[K comparable](m map[K]types.Value, k K, build func() types.Value) types.Value {
	if m == nil {
		return build()
	}
	if v, ok := m[k]; ok {
		return v
	}
	v := build()
	m[k] = v
	return v
}

func useContextMemo(r capability.UseRequest, now time.Time, lens *keyLens, memo *keyMemo) types.Record {
	if memo == nil || lens != nil {
		memo = &noMemo // nil maps: nothing kept
	}
	// Empty key sets are the one boxed empty set: boxing a Set allocates.
	pathKeys, domainKeys, cidrKeys, portKeys := emptySetValue, emptySetValue, emptySetValue, emptySetValue
	if r.Path != "" {
		pathKeys = stringSet(pathAncestors(r.Path))
	}
	if r.Domain != "" {
		d := strings.ToLower(r.Domain)
		domainKeys = memoized(memo.domain, d, func() types.Value { return stringSet(domainKeysOf(d)) })
	}
	if r.IP.IsValid() {
		ip := r.IP.Unmap()
		cidrKeys = memoized(memo.cidr, ip, func() types.Value { return stringSet(cidrKeysOf(ip, lens)) })
	}
	if hasPorts(r.Class) {
		portKeys = memoized(memo.port, r.Port, func() types.Value { return stringSet(portKeysOf(r.Port, lens)) })
	}
	return types.NewRecord(types.RecordMap{
		"now": types.NewDatetime(now),
		"request": types.NewRecord(types.RecordMap{
			"op":          opValue(r.Op),
			"path_keys":   pathKeys,
			"domain_keys": domainKeys,
			"cidr_keys":   cidrKeys,
			"port_keys":   portKeys,
			"item":        types.String(useItem(r)),
			"mode":        types.String(r.Mode),
		}),
	})
}

// opValues are the request ops as Cedar values, boxed once (a decision
// would otherwise allocate one).
var opValues = func() map[string]types.Value {
	m := map[string]types.Value{}
	for _, c := range capability.Classes {
		for _, op := range capability.Ops(c) {
			m[op] = types.String(op)
		}
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
func portBlocks(rs []capability.PortRange) []string {
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

// scopeAttrs is what the grant-time base policies read of a capability's
// scope (context.scope); each class's encoding (classes.go) fills those it
// uses.
type scopeAttrs struct {
	writes []string // every write, delete or persistence path and all its ancestors
	mode   string
	tls    bool
}

// writeAncestors adds every path of ps and all its ancestors to the writes.
func (s *scopeAttrs) writeAncestors(ps []string) {
	for _, p := range ps {
		s.writes = append(s.writes, pathAncestors(p)...)
	}
}

// grantScope summarizes a capability for the grant-time base policies.
func grantScope(c capability.Capability) types.Record {
	c = c.Normalized()
	var s scopeAttrs
	if f := encodingOf(c.Class).scope; f != nil {
		f(c, &s)
	}
	var flags []string
	return types.NewRecord(types.RecordMap{
		"write_keys":  stringSet(sortedUnique(s.writes)),
		"tls_inspect": types.Boolean(s.tls),
		"mode":        types.String(s.mode),
		"flags":       stringSet(flags),
	})
}

// CedarRequest is the Cedar request Decide evaluates for a use-time request.
func CedarRequest(session string, r capability.UseRequest, now time.Time) cedar.Request {
	return cedar.Request{Principal: sessionUID(session), Action: actionUse, Resource: capabilityUID(r.Class), Context: useContext(r, now)}
}

// hasPorts: the class's use requests carry a port (and its keys).
func hasPorts(c capability.Class) bool { return encodingOf(c).ports }

// useItem is the request's item; for fs.scope's connect, which names a
// socket exactly, the socket's path, and for process's exec, which names a
// program exactly, the program's path.
func useItem(r capability.UseRequest) string {
	if (r.Class == capability.ClassFSScope && r.Op == "connect" || r.Class == capability.ClassProcess && r.Op == "exec") && r.Item == "" {
		return r.Path
	}
	return r.Item
}
