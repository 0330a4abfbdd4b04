package policy

// Decision layer: the Cedar entity model. Entity type and action names, the
// Session entity (SessionAttrs), the Grant entity that carries a live grant's
// scope as data (GrantData), and the interner that shares equal attribute
// values between entities.

import (
	"slices"
	"strconv"
	"time"

	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
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
func capabilityUID(c capability.Class) types.EntityUID {
	return types.NewEntityUID(typeCapability, types.String(c))
}
func grantUID(id string) types.EntityUID { return types.NewEntityUID(typeGrant, types.String(id)) }

func sessionEntity(s capability.SessionAttrs) types.Entity { return sessionEntityWith(s, nil) }

// sessionEntityWith builds the Session entity, sharing equal attribute values with
// other entities through in (nil: none shared).
func sessionEntityWith(s capability.SessionAttrs, in *interner) types.Entity {
	return types.Entity{UID: sessionUID(s.ID), Attributes: in.sessionRecord(s)}
}

// sessionRecord is the Session entity's attributes, shared through in with
// every session of the same attributes (a fleet's sessions mostly share
// their image, tier, risk and paths): the record's map is the larger part
// of a session's entity.
func (in *interner) sessionRecord(s capability.SessionAttrs) types.Record {
	if in == nil {
		return in.newSessionRecord(s)
	}
	// Every field length-prefixed, lists counted: no value can forge
	// another's key.
	var buf [256]byte
	key := appendField(buf[:0], s.Image)
	key = appendField(key, s.TrustTier)
	key = appendField(key, s.Risk)
	key = strconv.AppendBool(key, s.Headless)
	key = strconv.AppendBool(key, s.TLSInspection)
	for _, l := range [][]string{s.Protected, s.PolicyStore} {
		key = strconv.AppendInt(key, int64(len(l)), 10)
		key = append(key, '|')
		for _, v := range l {
			key = appendField(key, v)
		}
	}
	if len(key) > internMaxRecordKey {
		return in.newSessionRecord(s)
	}
	if r, ok := in.recs[string(key)]; ok {
		return r
	}
	r := in.newSessionRecord(s)
	if len(in.recs) < internMax {
		in.recs[string(key)] = r
	}
	return r
}

func (in *interner) newSessionRecord(s capability.SessionAttrs) types.Record {
	return types.NewRecord(types.RecordMap{
		"image":          in.str(s.Image),
		"trust_tier":     in.str(s.TrustTier),
		"risk":           in.str(s.Risk),
		"headless":       types.Boolean(s.Headless),
		"tls_inspection": types.Boolean(s.TLSInspection),
		"protected":      in.set(s.Protected),
		"policy_store":   in.set(s.PolicyStore),
	})
}

// appendField appends v length-prefixed.
func appendField(key []byte, v string) []byte {
	key = strconv.AppendInt(key, int64(len(v)), 10)
	key = append(key, ':')
	return append(key, v...)
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
	recs map[string]types.Record // Session entities' attributes
}

const (
	internMax    = 4096
	internMaxSet = 8   // elements
	internMaxLen = 256 // bytes, all elements together
	// internMaxRecordKey bounds a Session record's key (its attributes,
	// length-prefixed).
	internMaxRecordKey = 4096
)

func newInterner() *interner {
	return &interner{strs: map[string]types.Value{}, sets: map[string]types.Value{}, recs: map[string]types.Record{}}
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
	Capability capability.Capability
	Expires    time.Time // zero: never
	// Once is the kernel handle of an approve-once grant (zero for any
	// other): Decide reports which once grants allowed, so the agent can
	// ask the kernel whether the one use is spent.
	Once backend.HandleRef
}

// grantAttrs are the Grant entity's scope attributes (the schema's Grant
// type); each class's encoding (classes.go) fills those it uses, the rest
// stay empty.
type grantAttrs struct {
	domains, cidrs, ports, read, write, del, deny, flags, items []string
	mode                                                        string
	// nest: fs.scope's nesting levels of read, write and delete
	// (fsNestAxes), level 1's entries also in read, write and del.
	nest [len(fsNestAxes)][]capability.FSLevel
}

// emptyNest is the <axis>_nest record of an axis without nesting (every
// grant but fs.scope's, and most of those), boxed once.
var emptyNest = nestRecord(nil, nil)

// nestRecord is an axis's <axis>_nest record (the schema's FSNest): the
// level-1 denies and, for each deeper level up to MaxFSNesting, its
// entries and denies (empty past the last level).
func nestRecord(levels []capability.FSLevel, in *interner) types.Value {
	m := types.RecordMap{}
	for i := 1; i <= capability.MaxFSNesting; i++ {
		var l capability.FSLevel
		if i <= len(levels) {
			l = levels[i-1]
		}
		if i > 1 {
			m[types.String("a"+strconv.Itoa(i))] = in.set(l.Allow)
		}
		m[types.String("d"+strconv.Itoa(i))] = in.set(l.Deny)
	}
	return types.NewRecord(m)
}

// nestValue is axis i's <axis>_nest record.
func (a *grantAttrs) nestValue(i int, in *interner) types.Value {
	if len(a.nest[i]) == 0 {
		return emptyNest
	}
	return nestRecord(a.nest[i], in)
}

// flag adds name to the flags when on.
func (a *grantAttrs) flag(name string, on bool) {
	if on {
		a.flags = append(a.flags, name)
	}
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
	var a grantAttrs
	if f := encodingOf(c.Class).entity; f != nil {
		f(c, &a)
	}
	return types.Entity{
		UID: grantUID(g.ID),
		Attributes: types.NewRecord(types.RecordMap{
			"session":     session,
			"class":       in.str(string(c.Class)),
			"expires":     types.NewDatetime(exp),
			"domains":     in.set(a.domains),
			"cidrs":       in.set(a.cidrs),
			"ports":       in.set(a.ports),
			"read":        in.set(a.read),
			"write":       in.set(a.write),
			"delete":      in.set(a.del),
			"deny":        in.set(a.deny),
			"read_nest":   a.nestValue(0, in),
			"write_nest":  a.nestValue(1, in),
			"delete_nest": a.nestValue(2, in),
			"flags":       in.set(a.flags),
			"items":       in.set(a.items),
			"mode":        in.str(a.mode),
		}),
	}
}
