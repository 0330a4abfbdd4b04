package agent

// The agent's names for the vocabulary it shares with its callers, for the
// policy engine it drives and for the records it persists. The grammar and
// the types that cross the API live in agent/capability (so the operator CLI
// links neither Cedar nor the resolver), the Cedar engine in agent/policy,
// the durable state in agent/store; these aliases keep agent.Capability,
// agent.GrantRequest, agent.Engine, agent.ErrWidens, agent.GrantRecord ...
// meaning what they meant, for the agent's own files, its tests, the daemon
// and bench/. New code outside the agent imports those packages directly.

import (
	"time"

	cedar "github.com/cedar-policy/cedar-go"

	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/agent/policy"
	"github.com/shinken-agent/shinken/agent/store"
)

// The grammar (capability.go, capability_render.go, capability_within.go).
type (
	Class            = capability.Class
	Capability       = capability.Capability
	PortRange        = capability.PortRange
	EgressScope      = capability.EgressScope
	InboundScope     = capability.InboundScope
	FSScope          = capability.FSScope
	ClipboardScope   = capability.ClipboardScope
	GPUScope         = capability.GPUScope
	InstallScope     = capability.InstallScope
	PersistenceScope = capability.PersistenceScope
	CredentialsScope = capability.CredentialsScope
	PeripheralScope  = capability.PeripheralScope
	ProcessScope     = capability.ProcessScope
)

const (
	ClassNetEgress   = capability.ClassNetEgress
	ClassNetInbound  = capability.ClassNetInbound
	ClassFSScope     = capability.ClassFSScope
	ClassClipboard   = capability.ClassClipboard
	ClassGPU         = capability.ClassGPU
	ClassInstall     = capability.ClassInstall
	ClassPersistence = capability.ClassPersistence
	ClassCredentials = capability.ClassCredentials
	ClassPeripheral  = capability.ClassPeripheral
	ClassProcess     = capability.ClassProcess

	GPUModeCompute = capability.GPUModeCompute
	GPUModeRender  = capability.GPUModeRender
	GPUModeRaw     = capability.GPUModeRaw
	InstallPkg     = capability.InstallPkg
	InstallAny     = capability.InstallAny
)

// Classes lists the classes in the seed's order.
var Classes = capability.Classes

// ParseClass parses a class name.
func ParseClass(s string) (Class, error) { return capability.ParseClass(s) }

// ParsePortRange parses "443" or "8000-8100".
func ParsePortRange(s string) (PortRange, error) { return capability.ParsePortRange(s) }

// Empty returns the empty (zero-authority) capability of class c.
func Empty(c Class) Capability { return capability.Empty(c) }

// Manifests (manifest.go).
type (
	Manifest      = capability.Manifest
	ManifestEntry = capability.ManifestEntry
	ManifestError = capability.ManifestError
)

// ParseManifests parses a manifest file (capability.ParseManifests).
func ParseManifests(file string, data []byte) ([]*Manifest, error) {
	return capability.ParseManifests(file, data)
}

// LoadManifestDir parses every *.manifest file of dir.
func LoadManifestDir(dir string) (map[string]*Manifest, error) {
	return capability.LoadManifestDir(dir)
}

// Tiers, provenance and the two-of-three rule (tier.go).
type (
	Tier        = capability.Tier
	Provenance  = capability.Provenance
	TierContext = capability.TierContext
	Ingredients = capability.Ingredients
)

const (
	TierAuto   = capability.TierAuto
	TierNotify = capability.TierNotify
	TierAsk    = capability.TierAsk
	TierBlock  = capability.TierBlock

	FirstParty = capability.FirstParty
	External   = capability.External
)

// ParseTier parses "auto", "notify", "ask" or "block".
func ParseTier(s string) (Tier, error) { return capability.ParseTier(s) }

// ParseProvenance parses a provenance label; the empty string is first-party.
func ParseProvenance(s string) (Provenance, error) { return capability.ParseProvenance(s) }

// DefaultTier is the seed's default tier of c (capability.DefaultTier).
func DefaultTier(c Capability, tc TierContext) Tier { return capability.DefaultTier(c, tc) }

// Promote applies provenance-aware promotion (capability.Promote).
func Promote(t Tier, p Provenance) Tier { return capability.Promote(t, p) }

// TwoOfThree applies the "at most two of three unattended" rule.
func TwoOfThree(t Tier, before, after Ingredients) Tier {
	return capability.TwoOfThree(t, before, after)
}

// EffectiveTier is the tier a grant request lands on (capability.EffectiveTier).
func EffectiveTier(c Capability, tc TierContext, manifestTier *Tier, p Provenance, before Ingredients) Tier {
	return capability.EffectiveTier(c, tc, manifestTier, p, before)
}

// Grants, sessions, use-time requests, cards, events and the host's
// enforcement, as they cross the API.
type (
	GrantRequest = capability.GrantRequest
	Grant        = capability.Grant
	Lifecycle    = capability.Lifecycle
	GrantPhase   = capability.GrantPhase
	GrantInfo    = capability.GrantInfo
	SessionSpec  = capability.SessionSpec
	BreakerState = capability.BreakerState
	UseRequest   = capability.UseRequest
	UseDecision  = capability.UseDecision
	Card         = capability.Card
	CardItem     = capability.CardItem
	Event        = capability.Event
	Enforcement  = capability.Enforcement
)

const (
	LifecycleOnce     = capability.LifecycleOnce
	LifecycleSession  = capability.LifecycleSession
	LifecycleStanding = capability.LifecycleStanding

	PhasePending    = capability.PhasePending
	PhaseHandle     = capability.PhaseHandle
	PhaseApplying   = capability.PhaseApplying
	PhaseLive       = capability.PhaseLive
	PhaseRevoking   = capability.PhaseRevoking
	PhaseRevoked    = capability.PhaseRevoked
	PhaseRolledBack = capability.PhaseRolledBack

	CardPending   = capability.CardPending
	CardApproved  = capability.CardApproved
	CardDenied    = capability.CardDenied
	CardCancelled = capability.CardCancelled
	CardTimedOut  = capability.CardTimedOut

	DefaultDeny = capability.DefaultDeny
)

// Policy changes and the permissiveness gate's report.
type (
	PolicyChange     = capability.PolicyChange
	PolicyReport     = capability.PolicyReport
	ForbidReport     = capability.ForbidReport
	DecideOnlyForbid = capability.DecideOnlyForbid
	ShiftReport      = capability.ShiftReport
	Counterexample   = capability.Counterexample
	SessionAttrs     = capability.SessionAttrs
)

// Errors defined beside the types that return them.
var (
	ErrInvalidCapability = capability.ErrInvalidCapability
	ErrWidens            = capability.ErrWidens
	ErrManifest          = capability.ErrManifest
	ErrOutsideManifest   = capability.ErrOutsideManifest
	ErrNotEnforceable    = capability.ErrNotEnforceable
	ErrTLSInspection     = capability.ErrTLSInspection
	ErrInvalidRequest    = capability.ErrInvalidRequest
	ErrUnknownSession    = capability.ErrUnknownSession
	ErrDenied            = capability.ErrDenied
)

// The policy engine (agent/policy).
type (
	Engine        = policy.Engine
	Decision      = policy.Decision
	GrantData     = policy.GrantData
	ReloadOptions = policy.ReloadOptions
	PolicyError   = policy.PolicyError
	PolicyErrors  = policy.PolicyErrors
)

var (
	ErrPolicy       = policy.ErrPolicy
	ErrPolicyWidens = policy.ErrPolicyWidens
	ErrProof        = policy.ErrProof
)

// NewEngine loads the schema, the shipped policies and policyDir's.
func NewEngine(policyDir string) (*Engine, error) { return policy.NewEngine(policyDir) }

// ProveGrant is step 2 of GRANT: the grant's compiled policy permits
// nothing its capability does not cover (policy.ProveGrant).
func ProveGrant(g GrantData, now time.Time) error { return policy.ProveGrant(g, now) }

// DefaultProtected returns the paths no session may write for a home
// directory.
func DefaultProtected(home string) []string { return policy.DefaultProtected(home) }

// CedarRequest is the Cedar request Decide evaluates for a use-time request.
func CedarRequest(session string, r UseRequest, now time.Time) cedar.Request {
	return policy.CedarRequest(session, r, now)
}

// The durable state (agent/store): the records the agent persists.
type (
	GrantRecord    = store.GrantRecord
	SessionRecord  = store.SessionRecord
	SessionPhase   = store.SessionPhase
	ApprovalRecord = store.ApprovalRecord
	Pattern        = store.Pattern
)

const (
	SessionCreating = store.SessionCreating
	SessionActive   = store.SessionActive
	SessionEnding   = store.SessionEnding
)

// ErrState wraps failures to read or write the durable state.
var ErrState = store.ErrState
