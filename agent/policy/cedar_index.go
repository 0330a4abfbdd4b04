package policy

// Decision layer: the per-session index Decide evaluates. The base set sliced
// by class (policyBase), and per session its Session entity and grants bound
// to their class's template (sessionSet, sessionView), so a decision's cost
// does not grow with the number of sessions.

import (
	"iter"
	"net/netip"
	"slices"
	"strings"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

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
const nClasses = capability.NumClasses

// classIndex is c's position in Classes, or -1.
func classIndex(c capability.Class) int {
	for i, x := range capability.Classes {
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
			if i := classIndex(capability.Class(sc.Entity.ID)); i >= 0 {
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
func requestKeys(r capability.UseRequest) keyKinds {
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
	entities types.EntityMap // the grants' entities; nil when it has none (a map with one entry costs ~1 KiB a session)
	lens     keyLens         // address and port key lengths its grants name
	byClass  [nClasses][]boundGrant
	once     map[string]backend.HandleRef // "grant:<id>" of its approve-once grants → kernel handle
}

// Get is the session's entity store (types.EntityGetter): its Session
// entity and its grants' entities.
func (s *sessionSet) Get(uid types.EntityUID) (types.Entity, bool) {
	if uid == s.uid {
		return s.entity, true
	}
	return s.entities.Get(uid)
}

// index rebuilds byClass from the grant entities (in grant id order).
func (s *sessionSet) index() {
	s.byClass = [nClasses][]boundGrant{}
	for uid, ent := range s.entities {
		if uid.Type != typeGrant {
			continue
		}
		v, _ := ent.Attributes.Get("class")
		i := classIndex(capability.Class(v.(types.String)))
		if i < 0 {
			continue
		}
		id := string(uid.ID)
		b := boundGrant{policy: cedar.PolicyID("grant:" + id), id: id, ent: ent}
		if capability.Classes[i] == capability.ClassNetEgress {
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
