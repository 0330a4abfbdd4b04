package policy

// Decision layer: the Cedar engine. Loads the schema, the shipped policies and
// the policy directory (with file:line errors), reloads it behind the
// permissiveness-shift check, keeps each session's entities and grants, and
// answers use-time (Decide) and grant-time (AuthorizeGrant) requests. The entity
// model, per-grant policies, request encoding and per-session index are in the
// other cedar_*.go files.

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"maps"
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
	"github.com/cedar-policy/cedar-go/types"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
	"github.com/cedar-policy/cedar-go/x/exp/schema"
	"github.com/cedar-policy/cedar-go/x/exp/schema/validate"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

//go:embed shinken.cedarschema *.cedar
var shippedPolicy embed.FS

// Errors of the decision layer.
var (
	ErrPolicy       = errors.New("agent: invalid policy")
	ErrPolicyWidens = errors.New("agent: policy edit widens authority")
)

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

// Decision is the answer to one request.
type Decision struct {
	Allowed bool     `json:"allowed"`
	Reasons []string `json:"reasons,omitempty"` // the policies that decided (forbids when denied)
	Errors  []string `json:"errors,omitempty"`  // policies that failed to evaluate (skipped, as Cedar does)
	// Once: when every permit that allowed is an approve-once grant, their
	// kernel handles (the agent asks the kernel whether they are spent).
	Once []backend.HandleRef `json:"-"`
}

// DecidedBy names the rule that decided: the first reason, preferring an
// admin or hard-deny rule by name over a grant when both decided, or
// capability.DefaultDeny when no policy did.
func (d Decision) DecidedBy() string {
	if len(d.Reasons) == 0 {
		return capability.DefaultDeny
	}
	for _, r := range d.Reasons {
		if !strings.HasPrefix(r, "grant:") {
			return r
		}
	}
	return d.Reasons[0]
}

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
	src, err := shippedPolicy.ReadFile("shinken.cedarschema")
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
	for i, c := range capability.Classes {
		p := grantPolicy(GrantData{ID: "probe", Session: "probe", Capability: capability.Empty(c)})
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
func (e *Engine) load(dir string) (*policyBase, error) { return e.loadWith(dir, nil) }

// loadWith is load with some files of the directory replaced (or added) by
// overlay (base name -> content), as a policy change proposes them.
func (e *Engine) loadWith(dir string, overlay map[string][]byte) (*policyBase, error) {
	b := &policyBase{policies: cedar.PolicyMap{}, where: map[cedar.PolicyID]string{}}
	var errs PolicyErrors
	shipped, _ := fs.Glob(shippedPolicy, "*.cedar")
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
		for name := range overlay {
			if f := filepath.Join(dir, name); !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
		slices.Sort(files)
		for _, f := range files {
			if data, ok := overlay[filepath.Base(f)]; ok {
				e.parseFile(f, data, b, &errs)
				continue
			}
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
func (e *Engine) Reload(opts ReloadOptions) (*capability.ShiftReport, error) {
	nb, err := e.load(e.dir)
	if err != nil {
		return nil, err
	}
	old := e.base.Load()
	rep := e.CheckShift(old.policies, nb.policies)
	if rep.Widens() && !opts.AllowWiden {
		return rep, WidensError(rep)
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
func (e *Engine) PutSession(s capability.SessionAttrs) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.sessions[s.ID]
	ns := &sessionSet{}
	if old != nil {
		ns.entities = old.entities // never modified once published: shared
		ns.lens = old.lens
		ns.byClass = old.byClass
		ns.once = old.once
	}
	ns.uid = sessionUID(s.ID)
	ns.uidValue = ns.uid
	ns.entity = sessionEntityWith(s, e.intern)
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
		return fmt.Errorf("%w: %q", capability.ErrUnknownSession, g.Session)
	}
	if g.ID == boundGrantID {
		return fmt.Errorf("%w: grant id %q is reserved", capability.ErrInvalidCapability, g.ID)
	}
	ns := &sessionSet{uid: old.uid, uidValue: old.uidValue, entity: old.entity, entities: make(types.EntityMap, len(old.entities)+1), once: old.once}
	maps.Copy(ns.entities, old.entities)
	ns.entities[grantUID(g.ID)] = grantEntityWith(g, e.intern, old.uidValue)
	if !g.Once.IsZero() {
		ns.once = maps.Clone(old.once)
		if ns.once == nil {
			ns.once = map[string]backend.HandleRef{}
		}
		ns.once["grant:"+g.ID] = g.Once
	}
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
	ns := &sessionSet{uid: old.uid, uidValue: old.uidValue, entity: old.entity, entities: old.entities.Clone(), once: old.once}
	delete(ns.entities, grantUID(id))
	if len(ns.entities) == 0 {
		ns.entities = nil
	}
	if _, ok := old.once["grant:"+id]; ok {
		ns.once = maps.Clone(old.once)
		delete(ns.once, "grant:"+id)
	}
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
		return nil, fmt.Errorf("%w: %q", capability.ErrUnknownSession, id)
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
func (e *Engine) Decide(session string, r capability.UseRequest, now time.Time) (Decision, error) {
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
	if r.Class == capability.ClassNetEgress {
		v.keys = requestKeys(r)
		if v.keys == 0 {
			v.grants = nil // no domain and no address: no egress grant can match
		}
	}
	d, diag := cedar.Authorize(v, v, cedar.Request{
		Principal: sessionUID(session),
		Action:    actionUse,
		Resource:  capabilityUID(r.Class),
		Context:   useContextLens(r, now, &lens),
	})
	out := decision(d, diag)
	if out.Allowed && len(s.once) > 0 {
		for _, id := range out.Reasons {
			ref, ok := s.once[id]
			if !ok { // some other permit allowed: no once grant is needed
				out.Once = nil
				break
			}
			out.Once = append(out.Once, ref)
		}
	}
	return out, nil
}

// AuthorizeGrant is step 1 of GRANT: may this session be granted c at this
// tier? Only the base set decides (a session's own grants never permit a new
// grant).
func (e *Engine) AuthorizeGrant(session string, c capability.Capability, tier capability.Tier, p capability.Provenance, lc capability.Lifecycle, now time.Time) (Decision, error) {
	s, err := e.session(session)
	if err != nil {
		return Decision{}, err
	}
	d, diag := cedar.Authorize(e.base.Load().policies, s, cedar.Request{
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

// AdminPermit evaluates a use request against the base set only (shipped
// and policy-directory policies, no grants) and returns the admin permit
// that allowed it.
func (e *Engine) AdminPermit(session string, r capability.UseRequest, now time.Time) (string, bool) {
	s, err := e.session(session)
	if err != nil {
		return "", false
	}
	d, diag := cedar.Authorize(e.base.Load().policies, s, cedar.Request{
		Principal: sessionUID(session), Action: actionUse, Resource: capabilityUID(r.Class), Context: useContext(r, now),
	})
	if d != cedar.Allow {
		return "", false
	}
	for _, reason := range diag.Reasons {
		if !strings.HasPrefix(string(reason.PolicyID), "grant:") {
			return string(reason.PolicyID), true
		}
	}
	return "", false
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
				pm[g.policy] = linkedGrantPolicy(g.id, string(s.uid.ID), capability.Classes[i])
			}
		}
		em[s.uid] = s.entity
		for k, v := range s.entities {
			em[k] = v
		}
	}
	return pm, em
}
