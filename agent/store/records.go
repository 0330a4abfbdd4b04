package store

// The records the store persists, the State that holds them, and the key
// scheme that names one record ("s/ID", "g/ID", "a/ID", "c/ID", "p/ID").

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// GrantRecord is one grant as persisted.
type GrantRecord struct {
	ID         string                `json:"id"` // the handle id (hex of the token's random part)
	Session    string                `json:"session"`
	Capability capability.Capability `json:"capability"`
	Tier       capability.Tier       `json:"tier"`
	Provenance capability.Provenance `json:"provenance"`
	Lifecycle  capability.Lifecycle  `json:"lifecycle"`
	Expires    time.Time             `json:"expires,omitzero"`
	Parent     string                `json:"parent,omitempty"` // parent grant id (attenuation)
	Approver   string                `json:"approver,omitempty"`
	Kernel     backend.HandleRef     `json:"kernel"`
	// Delta is the grant's OS state (from PhaseApplying on: what may be in
	// the kernel).
	Delta backend.Delta `json:"delta,omitzero"`
	// LegacyRules is the rule list of state files written before Delta
	// (net.egress and net.inbound rules); it is moved into Delta on load.
	LegacyRules []backend.EgressRule  `json:"rules,omitempty"`
	Phase       capability.GrantPhase `json:"phase"`
	// AuditMark and AuditHash name the last record of the audit commit
	// the live record was written beside (agent.BesideCommitter): its
	// seq and its hash; 0 and "" when the live record was written after
	// its records were durable. A start whose audit log does not hold
	// that record (none at the seq, or another one) treats the grant as
	// never live.
	AuditMark uint64    `json:"audit_mark,omitempty"`
	AuditHash string    `json:"audit_hash,omitempty"`
	Created   time.Time `json:"created"`
	Ended     time.Time `json:"ended,omitzero"`
	EndReason string    `json:"end_reason,omitempty"`
}

// SessionPhase is where a session stands.
type SessionPhase string

const (
	SessionCreating SessionPhase = "creating"
	SessionActive   SessionPhase = "active"
	SessionEnding   SessionPhase = "ending"
)

// SessionRecord is one session as persisted.
type SessionRecord struct {
	Spec        capability.SessionSpec  `json:"spec"`
	Phase       SessionPhase            `json:"phase"`
	Ingredients capability.Ingredients  `json:"ingredients"`
	Breaker     capability.BreakerState `json:"breaker"`
	Created     time.Time               `json:"created"`
}

// ApprovalRecord is one pending Ask. Request.Parent is always empty (a handle
// token is a capability and is never stored or listed); ParentGrant names the
// parent grant of an attenuation.
type ApprovalRecord struct {
	ID          string                  `json:"id"`
	Request     capability.GrantRequest `json:"request"`
	ParentGrant string                  `json:"parent_grant,omitempty"`
	Tier        capability.Tier         `json:"tier"`
	Created     time.Time               `json:"created"`
	Expires     time.Time               `json:"expires"`
}

// Pattern is an "approve this pattern" decision: the same capability scope
// asked again by the same session is approved without a new card. The
// agent's card protocol makes and matches them; the store only keeps them.
type Pattern struct {
	Card    string                `json:"card"`
	Session string                `json:"session"`
	Scope   capability.Capability `json:"scope"`
	Decider string                `json:"decider"`
	Created time.Time             `json:"created,omitzero"` // patterns are tried oldest first
}

// State is everything the agent persists. Its maps are never nil.
type State struct {
	Version int `json:"version"`
	// Through is the highest journal segment (state.journal.N) the
	// snapshot holds; Open replays only the segments above it. Zero, and
	// left out, when no segment was folded.
	Through   uint64                      `json:"through,omitempty"`
	Sessions  map[string]*SessionRecord   `json:"sessions"`
	Grants    map[string]*GrantRecord     `json:"grants"`
	Approvals map[string]*ApprovalRecord  `json:"approvals"`
	Cards     map[string]*capability.Card `json:"cards,omitempty"`    // approval cards
	Patterns  map[string]*Pattern         `json:"patterns,omitempty"` // approved patterns, by "card/item"
}

// stateVersion is the snapshot format this package reads and writes; a
// snapshot of any other version refuses to load.
const stateVersion = 1

func newState() *State {
	return &State{Version: stateVersion, Sessions: map[string]*SessionRecord{}, Grants: map[string]*GrantRecord{}, Approvals: map[string]*ApprovalRecord{},
		Cards: map[string]*capability.Card{}, Patterns: map[string]*Pattern{}}
}

// The key of one record, as Store.Write takes it: the record's kind letter
// (the journal line's "k"), a slash, its id (its key in the State's map).

// SessionKey names State.Sessions[id].
func SessionKey(id string) string { return "s/" + id }

// GrantKey names State.Grants[id].
func GrantKey(id string) string { return "g/" + id }

// ApprovalKey names State.Approvals[id].
func ApprovalKey(id string) string { return "a/" + id }

// CardKey names State.Cards[id].
func CardKey(id string) string { return "c/" + id }

// PatternKey names State.Patterns[id] ("card/item").
func PatternKey(id string) string { return "p/" + id }

func (st *State) lookup(key string) (any, bool) {
	id := key[2:]
	switch key[0] {
	case 's':
		r, ok := st.Sessions[id]
		return r, ok
	case 'g':
		r, ok := st.Grants[id]
		return r, ok
	case 'a':
		r, ok := st.Approvals[id]
		return r, ok
	case 'c':
		r, ok := st.Cards[id]
		return r, ok
	case 'p':
		r, ok := st.Patterns[id]
		return r, ok
	}
	return nil, false
}

type keyedRecord struct {
	key string // "s/ID", "g/ID", "a/ID", "c/ID", "p/ID"
	v   any
}

func (st *State) records() []keyedRecord {
	out := make([]keyedRecord, 0, len(st.Sessions)+len(st.Grants)+len(st.Approvals))
	for id, r := range st.Sessions {
		out = append(out, keyedRecord{SessionKey(id), r})
	}
	for id, r := range st.Grants {
		out = append(out, keyedRecord{GrantKey(id), r})
	}
	for id, r := range st.Approvals {
		out = append(out, keyedRecord{ApprovalKey(id), r})
	}
	for id, r := range st.Cards {
		out = append(out, keyedRecord{CardKey(id), r})
	}
	for id, r := range st.Patterns {
		out = append(out, keyedRecord{PatternKey(id), r})
	}
	return out
}

func (st *State) fillMaps() {
	if st.Sessions == nil {
		st.Sessions = map[string]*SessionRecord{}
	}
	if st.Grants == nil {
		st.Grants = map[string]*GrantRecord{}
	}
	if st.Approvals == nil {
		st.Approvals = map[string]*ApprovalRecord{}
	}
	if st.Cards == nil {
		st.Cards = map[string]*capability.Card{}
	}
	if st.Patterns == nil {
		st.Patterns = map[string]*Pattern{}
	}
}

// apply replays one journal line onto st.
func (st *State) apply(jl journalLine) error {
	switch jl.Kind {
	case "s":
		if jl.Del {
			delete(st.Sessions, jl.ID)
			return nil
		}
		var r SessionRecord
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Sessions[jl.ID] = &r
	case "g":
		if jl.Del {
			delete(st.Grants, jl.ID)
			return nil
		}
		var r GrantRecord
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Grants[jl.ID] = &r
	case "a":
		if jl.Del {
			delete(st.Approvals, jl.ID)
			return nil
		}
		var r ApprovalRecord
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Approvals[jl.ID] = &r
	case "c":
		if jl.Del {
			delete(st.Cards, jl.ID)
			return nil
		}
		var r capability.Card
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Cards[jl.ID] = &r
	case "p":
		if jl.Del {
			delete(st.Patterns, jl.ID)
			return nil
		}
		var r Pattern
		if err := json.Unmarshal(jl.Rec, &r); err != nil {
			return err
		}
		st.Patterns[jl.ID] = &r
	default:
		return fmt.Errorf("unknown record kind %q", jl.Kind)
	}
	return nil
}
