package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Sentinel errors.
var (
	ErrInvalidEvent = errors.New("audit: invalid event")
	ErrClosed       = errors.New("audit: log closed")
	ErrFailed       = errors.New("audit: log failed; reopen it")
	ErrKey          = errors.New("audit: signing key")
	ErrCorrupt      = errors.New("audit: log does not continue its chain")
	ErrTampered     = errors.New("audit: verification failed")
)

// EventType names what happened. The set is closed: Append refuses others.
type EventType string

const (
	EventRequest       EventType = "request"        // a capability request arrived
	EventDecision      EventType = "decision"       // Cedar / tier decision: allow, ask, deny
	EventGrant         EventType = "grant"          // a grant was compiled into the kernel
	EventAttenuate     EventType = "attenuate"      // a child handle was cut from a parent
	EventRevoke        EventType = "revoke"         // a handle (and its subtree) was revoked
	EventApproval      EventType = "approval"       // a human answered a card: Outcome says how
	EventOverride      EventType = "override"       // a human overrode a soft-mandatory tier (Actor)
	EventTimeout       EventType = "timeout"        // a card timed out: the action did not run
	EventKernelDenial  EventType = "kernel_denial"  // the kernel refused something (Count may aggregate)
	EventSessionCreate EventType = "session_create" // a session was created
	EventSessionDelete EventType = "session_delete" // a session was torn down
	EventAgentStart    EventType = "agent_start"    // the daemon started (adopted or fresh)
	EventAgentStop     EventType = "agent_stop"     // the daemon stopped cleanly
	EventRecovered     EventType = "audit_recovered"
)

var eventTypes = map[EventType]bool{
	EventRequest: true, EventDecision: true, EventGrant: true, EventAttenuate: true, EventRevoke: true,
	EventApproval: true, EventOverride: true, EventTimeout: true, EventKernelDenial: true,
	EventSessionCreate: true, EventSessionDelete: true, EventAgentStart: true, EventAgentStop: true,
	EventRecovered: true, EventSuppressed: true,
}

// Event is what a caller records. Every string is free text and goes through
// [Redact]; Params is hashed and never stored.
type Event struct {
	Type EventType
	Time time.Time // zero: now

	Human   string // the authorising human (uid or name)
	AgentID string
	Model   string // model name and version
	Tool    string
	CallID  string // request / tool call id
	Params  []byte // raw tool parameters: only SHA-256(Params) is stored

	Action     string // the verb
	Resource   string // what it acts on (domain, path, address:port)
	RuleID     string // the policy rule that fired
	Tier       string // auto, notify, ask, block
	Provenance string // first-party, external
	Outcome    string // allow, deny, ask, granted, approved_once, approved_session, approved_pattern, denied, cancelled, timed_out, ...
	Reason     string
	Scope      string // the computed scope of the grant
	Lifetime   string // once, session, standing, or a TTL
	Expires    time.Time
	Session    string
	Handle     string
	Parent     string // the parent handle of an attenuation
	Card       string // approval card id
	Actor      string // the overriding actor of an override
	Count      uint64 // how many denials (kernel, or use-time) one record aggregates
}

// Record is one line of the log. The field order is the canonical order.
type Record struct {
	Seq      uint64 `json:"seq"`
	Time     string `json:"time"`
	PrevHash string `json:"prev_hash"`
	Event    string `json:"event.name"`

	Human        string `json:"user.id,omitempty"`
	AgentID      string `json:"gen_ai.agent.id,omitempty"`
	Model        string `json:"gen_ai.request.model,omitempty"`
	Tool         string `json:"gen_ai.tool.name,omitempty"`
	CallID       string `json:"gen_ai.tool.call.id,omitempty"`
	Session      string `json:"session.id,omitempty"`
	ParamsSHA256 string `json:"shinken.params.sha256,omitempty"`

	Action     string `json:"shinken.action,omitempty"`
	Resource   string `json:"shinken.resource,omitempty"`
	RuleID     string `json:"shinken.rule.id,omitempty"`
	Tier       string `json:"shinken.tier,omitempty"`
	Provenance string `json:"shinken.provenance,omitempty"`
	Outcome    string `json:"shinken.outcome,omitempty"`
	Reason     string `json:"shinken.reason,omitempty"`
	Scope      string `json:"shinken.scope,omitempty"`
	Lifetime   string `json:"shinken.lifetime,omitempty"`
	Expires    string `json:"shinken.expires,omitempty"`
	Handle     string `json:"shinken.handle,omitempty"`
	Parent     string `json:"shinken.handle.parent,omitempty"`
	Card       string `json:"shinken.card.id,omitempty"`
	Actor      string `json:"shinken.actor,omitempty"`
	Count      uint64 `json:"shinken.count,omitempty"`

	Redacted []string `json:"shinken.redacted,omitempty"`

	Sig string `json:"sig,omitempty"` // always last
}

// MaxField is the longest a free-text field may be once redacted; longer
// values are cut (at a rune boundary) and end in "...[truncated]".
const MaxField = 4096

// maxLine bounds one line of the log (every field at MaxField, escaped).
const maxLine = 1 << 20

const timeFormat = time.RFC3339Nano

var (
	recordDomain     = []byte("shinken-audit-record-v1\x00")
	checkpointDomain = []byte("shinken-audit-checkpoint-v1\x00")
	genesisDomain    = []byte("shinken-audit-genesis-v1\x00")
)

// GenesisHash is the prev_hash of the first record of a log signed by pub.
func GenesisHash(pub ed25519.PublicKey) string {
	h := sha256.New()
	h.Write(genesisDomain)
	h.Write(pub)
	return hex.EncodeToString(h.Sum(nil))
}

// build turns ev into an unsealed record: validated, redacted, params hashed.
func build(ev Event, now time.Time) (Record, error) {
	if !eventTypes[ev.Type] {
		return Record{}, fmt.Errorf("%w: unknown event type %q", ErrInvalidEvent, ev.Type)
	}
	t := ev.Time
	if t.IsZero() {
		t = now
	}
	r := Record{
		Time:  t.UTC().Format(timeFormat),
		Event: string(ev.Type),
		Count: ev.Count,
	}
	if ev.Params != nil {
		sum := sha256.Sum256(ev.Params)
		r.ParamsSHA256 = hex.EncodeToString(sum[:])
	}
	if !ev.Expires.IsZero() {
		r.Expires = ev.Expires.UTC().Format(timeFormat)
	}
	fields := []struct {
		name string
		src  string
		dst  *string
	}{
		{"user.id", ev.Human, &r.Human},
		{"gen_ai.agent.id", ev.AgentID, &r.AgentID},
		{"gen_ai.request.model", ev.Model, &r.Model},
		{"gen_ai.tool.name", ev.Tool, &r.Tool},
		{"gen_ai.tool.call.id", ev.CallID, &r.CallID},
		{"session.id", ev.Session, &r.Session},
		{"shinken.action", ev.Action, &r.Action},
		{"shinken.resource", ev.Resource, &r.Resource},
		{"shinken.rule.id", ev.RuleID, &r.RuleID},
		{"shinken.tier", ev.Tier, &r.Tier},
		{"shinken.provenance", ev.Provenance, &r.Provenance},
		{"shinken.outcome", ev.Outcome, &r.Outcome},
		{"shinken.reason", ev.Reason, &r.Reason},
		{"shinken.scope", ev.Scope, &r.Scope},
		{"shinken.lifetime", ev.Lifetime, &r.Lifetime},
		{"shinken.handle", ev.Handle, &r.Handle},
		{"shinken.handle.parent", ev.Parent, &r.Parent},
		{"shinken.card.id", ev.Card, &r.Card},
		{"shinken.actor", ev.Actor, &r.Actor},
	}
	for _, f := range fields {
		v, red := clean(f.src)
		*f.dst = v
		if red {
			r.Redacted = append(r.Redacted, f.name)
		}
	}
	return r, nil
}

// clean makes s valid UTF-8, redacts it and bounds its length.
func clean(s string) (string, bool) {
	if s == "" {
		return "", false
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s, red := Redact(s)
	if len(s) > MaxField {
		const mark = "...[truncated]"
		cut := MaxField - len(mark)
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + mark
		// A cut through a secret can change what the patterns see: look
		// again (redaction only ever shortens or keeps the length).
		s, _ = Redact(s)
	}
	return s, red
}

// canonical is the record's bytes without its signature.
func (r Record) canonical() ([]byte, error) {
	r.Sig = ""
	return json.Marshal(r)
}

// Hash is the hex SHA-256 of the record's canonical bytes: what the next
// record carries as prev_hash.
func (r Record) Hash() (string, error) {
	c, err := r.canonical()
	if err != nil {
		return "", err
	}
	return hashOf(c), nil
}

func hashOf(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

func signMsg(domain, canonical []byte) []byte {
	return append(append(make([]byte, 0, len(domain)+len(canonical)), domain...), canonical...)
}

// seal signs r and returns its line (with the newline) and its hash.
func seal(r *Record, priv ed25519.PrivateKey) (line []byte, hash string, err error) {
	c, err := r.canonical()
	if err != nil {
		return nil, "", err
	}
	r.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, signMsg(recordDomain, c)))
	line, err = json.Marshal(r)
	if err != nil {
		return nil, "", err
	}
	return append(line, '\n'), hashOf(c), nil
}

// errNotCanonical and friends describe why one line is not a valid record.
var (
	errNotCanonical = errors.New("not in canonical form (edited or hand-written)")
	errBadSig       = errors.New("signature does not verify")
)

// parseLine decodes one line (without its newline), insists that it is
// byte for byte the canonical encoding of what it decodes to, and returns
// the record, its canonical bytes and its hash. It does not check the
// signature.
func parseLine(line []byte) (Record, []byte, string, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, nil, "", fmt.Errorf("not a record: %v", err)
	}
	if dec.More() {
		return r, nil, "", errors.New("not a record: trailing data")
	}
	again, err := json.Marshal(r)
	if err != nil {
		return r, nil, "", err
	}
	if !bytes.Equal(again, line) {
		return r, nil, "", errNotCanonical
	}
	c, err := r.canonical()
	if err != nil {
		return r, nil, "", err
	}
	return r, c, hashOf(c), nil
}

func checkSig(pub ed25519.PublicKey, domain, canonical []byte, sig string) error {
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return fmt.Errorf("%w (malformed signature)", errBadSig)
	}
	if !ed25519.Verify(pub, signMsg(domain, canonical), raw) {
		return errBadSig
	}
	return nil
}
