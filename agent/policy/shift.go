package policy

import (
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"

	"github.com/shinken-agent/shinken/agent/capability"
)

// ErrProof is returned when the grant-time check finds that a grant's policy
// permits a request its capability does not cover.
var ErrProof = errors.New("agent: grant permissiveness check failed")

// MaxShiftChecks bounds the bounded search of CheckShift.
var MaxShiftChecks = 300_000

func policyKey(p *cedar.Policy) string { return string(p.MarshalCedar()) }

// literals are the values a policy set mentions; the bounded search builds
// its requests from them, their neighbours and a fixed set of probes.
type literals struct {
	strs     []string
	longs    []int64
	ips      []netip.Prefix
	sessions []string
}

func (l *literals) collect(p *cedar.Policy) {
	a := (*xast.Policy)(p.AST())
	for _, s := range []any{a.Principal, a.Resource} {
		switch v := s.(type) {
		case xast.ScopeTypeEq:
			if v.Entity.Type == typeSession {
				l.sessions = append(l.sessions, string(v.Entity.ID))
			}
		case xast.ScopeTypeIn:
			if v.Entity.Type == typeSession {
				l.sessions = append(l.sessions, string(v.Entity.ID))
			}
		}
	}
	var addValue func(v types.Value)
	addValue = func(v types.Value) {
		switch x := v.(type) {
		case types.String:
			s := string(x)
			l.strs = append(l.strs, s)
			if pf, err := netip.ParsePrefix(s); err == nil {
				l.ips = append(l.ips, pf)
			} else if a, err := netip.ParseAddr(s); err == nil {
				l.ips = append(l.ips, netip.PrefixFrom(a, a.BitLen()))
			}
		case types.Long:
			l.longs = append(l.longs, int64(x))
		case types.IPAddr:
			l.ips = append(l.ips, netip.Prefix(x))
		case types.EntityUID:
			if x.Type == typeSession {
				l.sessions = append(l.sessions, string(x.ID))
			}
		case types.Set:
			for e := range x.All() {
				addValue(e)
			}
		case types.Record:
			for _, e := range x.All() {
				addValue(e)
			}
		}
	}
	for _, c := range a.Conditions {
		xast.Inspect(xast.NewNode(c.Body), func(n xast.IsNode) bool {
			switch v := n.(type) {
			case xast.NodeValue:
				addValue(v.Value)
			case xast.NodeTypeLike:
				s := string(v.Value.MarshalCedar())
				s = strings.Trim(s, `"`)
				l.strs = append(l.strs, strings.ReplaceAll(s, "*", "x"), strings.ReplaceAll(s, "*", ""))
			}
			return true
		})
	}
}

// SearchShift is the bounded search for a request the new set permits and
// the old one denied: no proof, but every counterexample it reports is
// real. CheckShift decides with the solver; the tests keep this search as a
// cross-check of the solver (agent/README.md §5).
func (e *Engine) SearchShift(old, neu cedar.PolicyMap) *capability.ShiftReport {
	oldKeys := map[string]cedar.Effect{}
	for _, p := range old {
		oldKeys[policyKey(p)] = p.Effect()
	}
	newKeys := map[string]bool{}
	onlyNarrowing := true
	for _, p := range neu {
		k := policyKey(p)
		newKeys[k] = true
		if _, had := oldKeys[k]; !had && p.Effect() == cedar.Permit {
			onlyNarrowing = false
		}
	}
	for k, eff := range oldKeys {
		if !newKeys[k] && eff == cedar.Forbid {
			onlyNarrowing = false
		}
	}
	if onlyNarrowing {
		return &capability.ShiftReport{Proved: true}
	}

	var lit literals
	for _, p := range old {
		lit.collect(p)
	}
	for _, p := range neu {
		lit.collect(p)
	}
	rep := &capability.ShiftReport{}
	now := time.Now()
	try := func(ents types.EntityMap, pr capability.SessionAttrs, req cedar.Request, ce *capability.Counterexample) bool {
		if rep.Checked >= MaxShiftChecks {
			rep.Truncated = true
			return false
		}
		rep.Checked++
		od, _ := cedar.Authorize(old, ents, req)
		if od == cedar.Allow {
			return true
		}
		nd, diag := cedar.Authorize(neu, ents, req)
		if nd == cedar.Allow {
			for _, r := range diag.Reasons {
				ce.Policies = append(ce.Policies, string(r.PolicyID))
			}
			ce.Principal = pr
			rep.Counterexample = ce
			return false
		}
		return true
	}
	for _, pr := range e.shiftPrincipals(&lit) {
		ents := types.EntityMap{sessionUID(pr.ID): sessionEntity(pr)}
		for _, c := range capability.Classes {
			for _, u := range useProbes(nil, c, &lit, pr) {
				u := u
				req := cedar.Request{Principal: sessionUID(pr.ID), Action: actionUse, Resource: capabilityUID(c), Context: useContext(u, now)}
				if !try(ents, pr, req, &capability.Counterexample{Action: "use", Class: c, Use: &u}) {
					return rep
				}
			}
			for _, g := range grantProbes(c, &lit) {
				for _, tier := range []capability.Tier{capability.TierAuto, capability.TierNotify, capability.TierAsk, capability.TierBlock} {
					for _, prov := range []capability.Provenance{capability.FirstParty, capability.External} {
						for _, lc := range []capability.Lifecycle{capability.LifecycleOnce, capability.LifecycleSession, capability.LifecycleStanding} {
							req := cedar.Request{Principal: sessionUID(pr.ID), Action: actionGrant, Resource: capabilityUID(c), Context: types.NewRecord(types.RecordMap{
								"now": types.NewDatetime(now), "tier": types.String(tier.String()), "provenance": types.String(string(prov)),
								"lifecycle": types.String(string(lc)), "scope": grantScope(g),
							})}
							ce := &capability.Counterexample{Action: "grant", Class: c, Grant: fmt.Sprintf("%s tier=%s provenance=%s lifecycle=%s", g, tier, prov, lc)}
							if !try(ents, pr, req, ce) {
								return rep
							}
						}
					}
				}
			}
		}
	}
	return rep
}

// shiftPrincipals: the live sessions (with their real attributes), the
// sessions the policies name, and synthetic sessions across every
// trust/risk/inspection/headless combination and every image literal.
func (e *Engine) shiftPrincipals(lit *literals) []capability.SessionAttrs {
	var out []capability.SessionAttrs
	e.mu.RLock()
	for _, s := range e.sessions {
		out = append(out, attrsFromEntity(s.entity))
		if len(out) >= 32 {
			break
		}
	}
	e.mu.RUnlock()
	ids := append([]string{"shift-probe"}, sortedUnique(lit.sessions)...)
	images := []string{""}
	for _, s := range sortedUnique(lit.strs) {
		if capability.ValidateToken("image", s) == nil && !strings.Contains(s, "/") && len(images) < 8 {
			images = append(images, s)
		}
	}
	for _, id := range ids {
		for _, img := range images {
			for _, trust := range []string{"low", "normal", "high"} {
				for _, risk := range []string{"normal", "high"} {
					for _, tls := range []bool{false, true} {
						for _, headless := range []bool{false, true} {
							out = append(out, capability.SessionAttrs{ID: id, Image: img, TrustTier: trust, Risk: risk, TLSInspection: tls, Headless: headless,
								Protected: DefaultProtected("/home/agent"), PolicyStore: []string{"/etc/shinken"}})
						}
					}
				}
			}
		}
	}
	return out
}

func attrsFromEntity(ent types.Entity) capability.SessionAttrs {
	a := capability.SessionAttrs{ID: string(ent.UID.ID)}
	get := func(k string) types.Value { v, _ := ent.Attributes.Get(types.String(k)); return v }
	str := func(k string) string { s, _ := get(k).(types.String); return string(s) }
	boo := func(k string) bool { b, _ := get(k).(types.Boolean); return bool(b) }
	set := func(k string) []string {
		s, _ := get(k).(types.Set)
		var out []string
		for v := range s.All() {
			if x, ok := v.(types.String); ok {
				out = append(out, string(x))
			}
		}
		return out
	}
	a.Image, a.TrustTier, a.Risk = str("image"), str("trust_tier"), str("risk")
	a.Headless, a.TLSInspection = boo("headless"), boo("tls_inspection")
	a.Protected, a.PolicyStore = set("protected"), set("policy_store")
	return a
}

// ProveGrant is step 2 of GRANT: it evaluates the grant's Cedar policy on
// probe requests built from the capability's own values and their
// neighbours (just inside and just outside every prefix, port range, path
// and domain) and fails if the policy permits any probe the capability does
// not cover. It checks the compiled policy against the grammar; it is a
// bounded test, not a proof over all requests. A grant already expired at
// now permits nothing and passes; any other is evaluated as unexpired at
// proofInstant, which is the same verdict (prove_contexts.go).
func ProveGrant(g GrantData, now time.Time) error {
	if !g.Expires.IsZero() && !now.Before(g.Expires) {
		return nil
	}
	g.Expires = time.Time{}
	pol := onePolicy{grantPolicy(g)}
	ents := types.EntityMap{grantUID(g.ID): grantEntity(g), sessionUID(g.Session): sessionEntity(capability.SessionAttrs{ID: g.Session})}
	var lit literals
	c := g.Capability.Normalized()
	if f := encodingOf(c.Class).literals; f != nil {
		f(c, &lit)
	}
	buf := probeBufs.Get().(*[]capability.UseRequest)
	defer probeBufs.Put(buf)
	*buf = useProbes(*buf, c.Class, &lit, capability.SessionAttrs{ID: g.Session})
	for _, u := range *buf {
		d, _ := cedar.Authorize(pol, ents, cedar.Request{Principal: sessionUID(g.Session), Action: actionUse, Resource: capabilityUID(c.Class), Context: proofContexts.context(u)})
		if d == cedar.Allow && !c.Allows(u) {
			return fmt.Errorf("%w: the policy of %s permits %+v, which the capability does not cover", ErrProof, c, u)
		}
	}
	return nil
}

// probeBufs holds ProveGrant's probe slices for reuse: a net.egress /32
// grant has 77 probes, some 10 KB a grant the collector would otherwise
// take back.
var probeBufs = sync.Pool{New: func() any { return new([]capability.UseRequest) }}

// onePolicy is a cedar.PolicyIterator over one policy: ProveGrant asks
// Authorize about a single policy some 200 times a grant, and a
// cedar.PolicyMap's iterator costs a map iteration and its state on the
// heap each time (about a sixth of the proof's CPU).
type onePolicy struct{ p *cedar.Policy }

func (o onePolicy) All() iter.Seq2[cedar.PolicyID, *cedar.Policy] {
	return func(yield func(cedar.PolicyID, *cedar.Policy) bool) { yield("grant", o.p) }
}

// DefaultProtected returns the paths no session may write for a home
// directory: credential dirs, PATH dirs and shell rc files.
func DefaultProtected(home string) []string {
	out := []string{"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"}
	if home != "" {
		for _, p := range []string{".ssh", ".aws", ".gnupg", ".kube", ".docker", ".config/gcloud", ".azure", ".netrc", ".git-credentials",
			".local/bin", "bin",
			".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zprofile", ".zshenv", ".zlogin", ".config/fish/config.fish"} {
			out = append(out, filepath.Join(home, p))
		}
	}
	return out
}
