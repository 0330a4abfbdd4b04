package agent

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
)

// ErrState wraps failures to read or write the durable state.
var ErrState = errors.New("agent: state")

// GrantPhase is where a grant stands in the GRANT / REVOKE sequences. The
// phase is persisted before the kernel step it announces, so after a crash
// reconcile knows what may have been applied.
type GrantPhase string

const (
	PhasePending    GrantPhase = "pending"    // intent recorded; the kernel handle may or may not exist
	PhaseHandle     GrantPhase = "handle"     // kernel handle issued and recorded
	PhaseApplying   GrantPhase = "applying"   // OS delta being pushed; Rules lists what may be in the kernel
	PhaseLive       GrantPhase = "live"       // everything applied; the grant is in force
	PhaseRevoking   GrantPhase = "revoking"   // the handle's bit is flipped; teardown under way
	PhaseRevoked    GrantPhase = "revoked"    // tombstone: revoked and torn down
	PhaseRolledBack GrantPhase = "rolledback" // tombstone: a grant that never went live
)

// Terminal reports whether the phase is a tombstone.
func (p GrantPhase) Terminal() bool { return p == PhaseRevoked || p == PhaseRolledBack }

// GrantRecord is one grant as persisted.
type GrantRecord struct {
	ID         string                 `json:"id"` // the handle id (hex of the token's random part)
	Session    string                 `json:"session"`
	Capability Capability             `json:"capability"`
	Tier       Tier                   `json:"tier"`
	Provenance Provenance             `json:"provenance"`
	Lifecycle  Lifecycle              `json:"lifecycle"`
	Expires    time.Time              `json:"expires,omitzero"`
	Parent     string                 `json:"parent,omitempty"` // parent grant id (attenuation)
	Approver   string                 `json:"approver,omitempty"`
	Kernel     dataplane.HandleRef    `json:"kernel"`
	Rules      []dataplane.EgressRule `json:"rules,omitempty"`
	Phase      GrantPhase             `json:"phase"`
	Created    time.Time              `json:"created"`
	Ended      time.Time              `json:"ended,omitzero"`
	EndReason  string                 `json:"end_reason,omitempty"`
}

// SessionPhase is where a session stands.
type SessionPhase string

const (
	SessionCreating SessionPhase = "creating"
	SessionActive   SessionPhase = "active"
	SessionEnding   SessionPhase = "ending"
)

// BreakerState is a session's denial circuit breaker.
type BreakerState struct {
	Consecutive int  `json:"consecutive"`
	Total       int  `json:"total"`
	Tripped     bool `json:"tripped"`
}

// SessionRecord is one session as persisted.
type SessionRecord struct {
	Spec        SessionSpec  `json:"spec"`
	Phase       SessionPhase `json:"phase"`
	Ingredients Ingredients  `json:"ingredients"`
	Breaker     BreakerState `json:"breaker"`
	Created     time.Time    `json:"created"`
}

// ApprovalRecord is one pending Ask. Request.Parent is always empty (a handle
// token is a capability and is never stored or listed); ParentGrant names the
// parent grant of an attenuation.
type ApprovalRecord struct {
	ID          string       `json:"id"`
	Request     GrantRequest `json:"request"`
	ParentGrant string       `json:"parent_grant,omitempty"`
	Tier        Tier         `json:"tier"`
	Created     time.Time    `json:"created"`
	Expires     time.Time    `json:"expires"`
}

// state is everything the agent persists.
type state struct {
	Version   int                        `json:"version"`
	Sessions  map[string]*SessionRecord  `json:"sessions"`
	Grants    map[string]*GrantRecord    `json:"grants"`
	Approvals map[string]*ApprovalRecord `json:"approvals"`
}

const stateVersion = 1

func newState() *state {
	return &state{Version: stateVersion, Sessions: map[string]*SessionRecord{}, Grants: map[string]*GrantRecord{}, Approvals: map[string]*ApprovalRecord{}}
}

// store persists the state by atomic replace: write a temporary file, fsync
// it, rename it over state.json, fsync the directory. A kill -9 at any
// instant leaves either the old or the new file, never a torn one.
type store struct {
	dir string
}

func (s store) path() string { return filepath.Join(s.dir, "state.json") }

func (s store) load() (*state, error) {
	data, err := os.ReadFile(s.path())
	if errors.Is(err, os.ErrNotExist) {
		return newState(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	st := newState()
	if err := json.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrState, s.path(), err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("%w: %s: version %d, want %d", ErrState, s.path(), st.Version, stateVersion)
	}
	return st, nil
}

func (s store) save(st *state) error {
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrState, err)
	}
	return writeFileAtomic(s.path(), data, 0o600)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	ok = true
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	return nil
}

// loadOrCreateKey returns the handle MAC key, creating it on first start.
func loadOrCreateKey(dir string) ([]byte, error) {
	p := filepath.Join(dir, "handle.key")
	key, err := os.ReadFile(p)
	if err == nil {
		if len(key) != 32 {
			return nil, fmt.Errorf("%w: %s: want 32 bytes, have %d", ErrState, p, len(key))
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	if err := writeFileAtomic(p, key, 0o600); err != nil {
		return nil, err
	}
	return key, nil
}
