package capability

import "fmt"

// Tier is a risk tier (seeds/permissions.md §3.2). Higher is riskier.
type Tier int

const (
	TierAuto   Tier = iota // run silently, still logged
	TierNotify             // run, stream a notice the human can veto
	TierAsk                // pause for a live human or reviewer approval
	TierBlock              // hard deny; never grantable in-session
)

var tierNames = [...]string{"auto", "notify", "ask", "block"}

func (t Tier) String() string {
	if t >= 0 && int(t) < len(tierNames) {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", int(t))
}

// ParseTier parses "auto", "notify", "ask" or "block".
func ParseTier(s string) (Tier, error) {
	for i, n := range tierNames {
		if n == s {
			return Tier(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown tier %q (want auto, notify, ask or block)", ErrInvalidCapability, s)
}

// MarshalText implements encoding.TextMarshaler.
func (t Tier) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (t *Tier) UnmarshalText(b []byte) error {
	v, err := ParseTier(string(b))
	*t = v
	return err
}

// Provenance labels where the parameters of a request came from (§3.3).
type Provenance string

const (
	FirstParty Provenance = "first-party" // the user's own instruction
	External   Provenance = "external"    // a web page, a fetched file, tool output
)

// ParseProvenance parses a provenance label; the empty string is first-party.
func ParseProvenance(s string) (Provenance, error) {
	switch Provenance(s) {
	case FirstParty, "":
		return FirstParty, nil
	case External:
		return External, nil
	}
	return "", fmt.Errorf("%w: unknown provenance %q", ErrInvalidCapability, s)
}

// TierContext is what the default tier table needs to know about a session.
type TierContext struct {
	Workspace string // the session's working tree (absolute); "" means none
}

// inWorkspace: p lies in the session's working tree (none: nothing does).
func (tc TierContext) inWorkspace(p string) bool {
	return tc.Workspace != "" && pathUnder(p, tc.Workspace)
}

// DefaultTier is the seed's default table (§3.2) applied to one capability.
// Each class's row is its spec's tier function (class_<name>.go, where a
// comment states the row); agent/README.md §3 tabulates them. An empty
// capability is auto (it grants nothing); an unknown class is block.
func DefaultTier(c Capability, tc TierContext) Tier {
	c = c.Normalized()
	if c.IsEmpty() {
		return TierAuto
	}
	if s := specOf(c.Class); s != nil {
		return s.tier(c, tc)
	}
	return TierBlock
}

// Promote applies provenance-aware promotion (§3.3): a request whose
// parameters derive from external content goes up at least one tier, and an
// Auto or Notify request lands on the human gate (Ask), following the seed's
// "Auto → Ask". An external Ask request becomes Block: the seed asks for at
// least one tier, and a human approving parameters chosen by a web page is
// exactly what the rule exists to stop; an operator can still pre-authorize
// it in admin policy. First-party requests keep their tier.
func Promote(t Tier, p Provenance) Tier {
	if p != External {
		return t
	}
	switch t {
	case TierAuto, TierNotify:
		return TierAsk
	default:
		return TierBlock
	}
}

// Ingredients are the three ingredients of the "at most two of three" rule
// (§3.3) as they stand for one session.
type Ingredients struct {
	ExternalIngestion     bool `json:"external_ingestion,omitempty"`
	CredentialAccess      bool `json:"credential_access,omitempty"`
	ExternalCommunication bool `json:"external_communication,omitempty"`
}

// Count returns how many of the three are present.
func (i Ingredients) Count() int {
	n := 0
	for _, b := range []bool{i.ExternalIngestion, i.CredentialAccess, i.ExternalCommunication} {
		if b {
			n++
		}
	}
	return n
}

// With returns the ingredients after a grant of c with provenance p.
func (i Ingredients) With(c Capability, p Provenance) Ingredients {
	if p == External {
		i.ExternalIngestion = true
	}
	c = c.Normalized()
	if s := specOf(c.Class); s != nil && s.ingredients != nil {
		i = s.ingredients(c, i)
	}
	return i
}

// TwoOfThree applies the "at most two of three unattended" rule: when a
// grant would give the session all three ingredients, it cannot run
// unattended, so its tier is raised to at least Ask.
func TwoOfThree(t Tier, before, after Ingredients) Tier {
	if after.Count() == 3 && t < TierAsk {
		return TierAsk
	}
	return t
}

// EffectiveTier is the tier a grant request lands on: the manifest's tier if
// the manifest entry names one (a manifest may lower or raise the default,
// but never below Block for a Block default), then provenance promotion, then
// the two-of-three rule.
func EffectiveTier(c Capability, tc TierContext, manifestTier *Tier, p Provenance, before Ingredients) Tier {
	t := DefaultTier(c, tc)
	if manifestTier != nil && t != TierBlock {
		t = *manifestTier
	}
	t = Promote(t, p)
	return TwoOfThree(t, before, before.With(c, p))
}
