package agent

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
)

// ErrProof is returned when the grant-time check finds that a grant's policy
// permits a request its capability does not cover.
var ErrProof = errors.New("agent: grant permissiveness check failed")

// Counterexample is one concrete request the new policy set allows and the
// old one denied.
type Counterexample struct {
	Principal SessionAttrs
	Action    string // "use" or "grant"
	Class     Class
	Use       *UseRequest // for "use"
	Grant     string      // for "grant": the grant context, rendered
	Policies  []string    // the policies that allowed it under the new set
}

func (c *Counterexample) String() string {
	if c == nil {
		return "<none>"
	}
	p := c.Principal
	who := fmt.Sprintf("session %q (image=%q trust=%s risk=%s tls_inspection=%t headless=%t)", p.ID, p.Image, p.TrustTier, p.Risk, p.TLSInspection, p.Headless)
	what := c.Grant
	if c.Use != nil {
		u := c.Use
		what = fmt.Sprintf("op=%s", u.Op)
		if u.Domain != "" {
			what += " domain=" + u.Domain
		}
		if u.IP.IsValid() {
			what += " ip=" + u.IP.String()
		}
		if u.Port != 0 {
			what += fmt.Sprintf(" port=%d", u.Port)
		}
		if u.Path != "" {
			what += " path=" + u.Path
		}
		if u.Item != "" {
			what += " item=" + u.Item
		}
		if u.Mode != "" {
			what += " mode=" + u.Mode
		}
	}
	return fmt.Sprintf("%s may now %s %s [%s], which the previous policy set denied (allowed by %s)", who, c.Action, c.Class, what, strings.Join(c.Policies, ", "))
}

// ShiftReport is the result of a permissiveness-shift check.
type ShiftReport struct {
	// Proved is true when the edit is non-widening by construction: every
	// policy it adds is a forbid and every policy it removes is a permit.
	// (Cedar is deny-by-default with forbid-overrides, so such an edit can
	// only turn Allow into Deny; this holds for every request.)
	Proved bool
	// Checked is how many concrete requests the bounded search evaluated
	// under both sets (0 when Proved).
	Checked int
	// Truncated is true when the request space hit MaxShiftChecks.
	Truncated bool
	// Counterexample is set when the new set allows a request the old one
	// denied (for the solver's, after the real authorizer confirmed it).
	Counterexample *Counterexample
	// Solver is the SMT proof's verdict ("unsat", "sat", "unknown"), or ""
	// when no solver ran (Proved by construction, or the bounded search).
	Solver string
	// Unproved says why the edit could not be proven non-widening without
	// a counterexample (a construct outside the provable subset, a solver
	// timeout or failure, an unconfirmed model); such an edit is treated
	// as widening.
	Unproved string
	// Abstracted lists unchanged policies outside the provable subset that
	// the proof treated as unknown Booleans (sound, but they may hide why).
	Abstracted []string
	// Elapsed is the time the check took.
	Elapsed time.Duration
}

// Widens reports whether the edit must be treated as widening: a
// counterexample was found, or non-widening could not be proven.
func (r *ShiftReport) Widens() bool { return r != nil && (r.Counterexample != nil || r.Unproved != "") }

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
func (e *Engine) SearchShift(old, neu cedar.PolicyMap) *ShiftReport {
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
		return &ShiftReport{Proved: true}
	}

	var lit literals
	for _, p := range old {
		lit.collect(p)
	}
	for _, p := range neu {
		lit.collect(p)
	}
	rep := &ShiftReport{}
	now := time.Now()
	try := func(ents types.EntityMap, pr SessionAttrs, req cedar.Request, ce *Counterexample) bool {
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
		ents := types.EntityMap{sessionUID(pr.ID): pr.entity()}
		for _, c := range Classes {
			for _, u := range useProbes(c, &lit, pr) {
				u := u
				req := cedar.Request{Principal: sessionUID(pr.ID), Action: actionUse, Resource: capabilityUID(c), Context: u.context(now)}
				if !try(ents, pr, req, &Counterexample{Action: "use", Class: c, Use: &u}) {
					return rep
				}
			}
			for _, g := range grantProbes(c, &lit) {
				for _, tier := range []Tier{TierAuto, TierNotify, TierAsk, TierBlock} {
					for _, prov := range []Provenance{FirstParty, External} {
						for _, lc := range []Lifecycle{LifecycleOnce, LifecycleSession, LifecycleStanding} {
							req := cedar.Request{Principal: sessionUID(pr.ID), Action: actionGrant, Resource: capabilityUID(c), Context: types.NewRecord(types.RecordMap{
								"now": types.NewDatetime(now), "tier": types.String(tier.String()), "provenance": types.String(string(prov)),
								"lifecycle": types.String(string(lc)), "scope": grantScope(g),
							})}
							ce := &Counterexample{Action: "grant", Class: c, Grant: fmt.Sprintf("%s tier=%s provenance=%s lifecycle=%s", g, tier, prov, lc)}
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
func (e *Engine) shiftPrincipals(lit *literals) []SessionAttrs {
	var out []SessionAttrs
	e.mu.RLock()
	for _, s := range e.sessions {
		for uid, ent := range s.entities {
			if uid.Type == typeSession {
				out = append(out, attrsFromEntity(ent))
			}
		}
		if len(out) >= 32 {
			break
		}
	}
	e.mu.RUnlock()
	ids := append([]string{"shift-probe"}, sortedUnique(lit.sessions)...)
	images := []string{""}
	for _, s := range sortedUnique(lit.strs) {
		if validateToken("image", s) == nil && !strings.Contains(s, "/") && len(images) < 8 {
			images = append(images, s)
		}
	}
	for _, id := range ids {
		for _, img := range images {
			for _, trust := range []string{"low", "normal", "high"} {
				for _, risk := range []string{"normal", "high"} {
					for _, tls := range []bool{false, true} {
						for _, headless := range []bool{false, true} {
							out = append(out, SessionAttrs{ID: id, Image: img, TrustTier: trust, Risk: risk, TLSInspection: tls, Headless: headless,
								Protected: DefaultProtected("/home/agent"), PolicyStore: []string{"/etc/shinken"}})
						}
					}
				}
			}
		}
	}
	return out
}

func attrsFromEntity(ent types.Entity) SessionAttrs {
	a := SessionAttrs{ID: string(ent.UID.ID)}
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

// Allows is the grammar's own (Go) meaning of a capability: does it cover
// this use-time request? The grant-time check compares it with what the
// grant's Cedar policy permits.
func (c Capability) Allows(r UseRequest) bool {
	if c.Class != r.Class {
		return false
	}
	c = c.Normalized()
	switch c.Class {
	case ClassNetEgress:
		if r.Op != "connect" {
			return false
		}
		if len(c.Egress.Ports) > 0 && !slices.ContainsFunc(c.Egress.Ports, func(p PortRange) bool { return p.Lo <= r.Port && r.Port <= p.Hi }) {
			return false
		}
		if r.Domain != "" && slices.ContainsFunc(c.Egress.Domains, func(d string) bool { return domainCovers(d, strings.ToLower(r.Domain)) }) {
			return true
		}
		return r.IP.IsValid() && slices.ContainsFunc(c.Egress.CIDRs, func(p netip.Prefix) bool { return p.Contains(r.IP.Unmap()) })
	case ClassNetInbound:
		if r.Op != "accept" || !r.IP.IsValid() {
			return false
		}
		if len(c.Inbound.Ports) > 0 && !slices.ContainsFunc(c.Inbound.Ports, func(p PortRange) bool { return p.Lo <= r.Port && r.Port <= p.Hi }) {
			return false
		}
		return slices.ContainsFunc(c.Inbound.CIDRs, func(p netip.Prefix) bool { return p.Contains(r.IP.Unmap()) })
	case ClassFSScope:
		if r.Path == "" || underAny(r.Path, c.FS.Deny) {
			return false
		}
		switch r.Op {
		case "read":
			return underAny(r.Path, c.FS.Read)
		case "write":
			return underAny(r.Path, c.FS.Write)
		}
	case ClassClipboard:
		return r.Op == "paste_in" && c.Clipboard.PasteIn || r.Op == "copy_out" && c.Clipboard.CopyOut
	case ClassGPU:
		return r.Op == "use" && slices.Contains(c.GPU.DeviceIDs, r.Item) && r.Mode == c.GPU.Mode
	case ClassInstall:
		return r.Op == InstallPkg && c.Install.Scope != "" || r.Op == InstallAny && c.Install.Scope == InstallAny
	case ClassPersistence:
		return r.Op == "persist" && r.Path != "" && underAny(r.Path, c.Persistence.Paths)
	case ClassCredentials:
		return r.Op == "broker" && slices.Contains(c.Credentials.BrokerScopes, r.Item)
	case ClassPeripheral:
		p := c.Peripheral
		switch r.Op {
		case "camera":
			return p.Camera
		case "mic":
			return p.Mic
		case "input_inject":
			return p.InputInject
		case "usb":
			return slices.Contains(p.USB, r.Item)
		}
	}
	return false
}

// ProveGrant is step 2 of GRANT: it evaluates the grant's Cedar policy on
// probe requests built from the capability's own values and their
// neighbours (just inside and just outside every prefix, port range, path
// and domain) and fails if the policy permits any probe the capability does
// not cover. It checks the compiled policy against the grammar; it is a
// bounded test, not a proof over all requests.
func ProveGrant(g GrantData, now time.Time) error {
	pol := cedar.PolicyMap{"grant": grantPolicy(g)}
	ents := types.EntityMap{grantUID(g.ID): grantEntity(g), sessionUID(g.Session): SessionAttrs{ID: g.Session}.entity()}
	var lit literals
	c := g.Capability.Normalized()
	var buf bytes.Buffer
	buf.WriteString(c.String())
	switch c.Class {
	case ClassNetEgress:
		for _, d := range c.Egress.Domains {
			base := strings.TrimPrefix(strings.TrimPrefix(d, "**."), "*.")
			lit.strs = append(lit.strs, base, "y."+base, "x"+base)
			if _, parent, ok := strings.Cut(base, "."); ok {
				lit.strs = append(lit.strs, parent)
			}
		}
		lit.ips = c.Egress.CIDRs
		for _, p := range c.Egress.Ports {
			lit.longs = append(lit.longs, int64(p.Lo), int64(p.Hi))
		}
		lit.longs = append(lit.longs, 1, 65534)
	case ClassNetInbound:
		lit.ips = c.Inbound.CIDRs
		for _, p := range c.Inbound.Ports {
			lit.longs = append(lit.longs, int64(p.Lo), int64(p.Hi))
		}
		lit.longs = append(lit.longs, 1, 65534)
	case ClassFSScope:
		for _, l := range [][]string{c.FS.Read, c.FS.Write, c.FS.Deny} {
			for _, p := range l {
				lit.strs = append(lit.strs, p, p+"x", filepath.Dir(p))
			}
		}
	case ClassPersistence:
		for _, p := range c.Persistence.Paths {
			lit.strs = append(lit.strs, p, p+"x", filepath.Dir(p))
		}
	case ClassGPU:
		lit.strs = append(lit.strs, c.GPU.DeviceIDs...)
	case ClassCredentials:
		lit.strs = append(lit.strs, c.Credentials.BrokerScopes...)
	case ClassPeripheral:
		lit.strs = append(lit.strs, c.Peripheral.USB...)
	}
	for _, u := range useProbes(c.Class, &lit, SessionAttrs{ID: g.Session}) {
		d, _ := cedar.Authorize(pol, ents, cedar.Request{Principal: sessionUID(g.Session), Action: actionUse, Resource: capabilityUID(c.Class), Context: u.context(now)})
		if d == cedar.Allow && !c.Allows(u) {
			return fmt.Errorf("%w: the policy of %s permits %+v, which the capability does not cover", ErrProof, c, u)
		}
	}
	return nil
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
