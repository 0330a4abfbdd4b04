package dataplane

import "github.com/shinken-agent/shinken/agent/backend"

// The kernel's vocabulary is shared with the control plane through the
// backend seam (package agent/backend); these names keep the dataplane's own
// code and tests reading as before.

// Sentinel errors. Every error returned by this package that concerns bad input
// wraps one of these, and a call that fails leaves the maps as they were.
var (
	ErrNotSupported      = backend.ErrNotSupported
	ErrSessionNotFound   = backend.ErrSessionNotFound
	ErrSessionExists     = backend.ErrSessionExists
	ErrInvalidSession    = backend.ErrInvalidSession
	ErrInvalidPrefix     = backend.ErrInvalidPrefix
	ErrInvalidPorts      = backend.ErrInvalidPorts
	ErrInvalidProto      = backend.ErrInvalidProto
	ErrInvalidHandle     = backend.ErrInvalidHandle
	ErrHandleNotLive     = backend.ErrHandleNotLive
	ErrHandleLive        = backend.ErrHandleLive
	ErrChainTooDeep      = backend.ErrChainTooDeep
	ErrMapFull           = backend.ErrMapFull
	ErrRulesFull         = backend.ErrRulesFull
	ErrCoverTooDeep      = backend.ErrCoverTooDeep
	ErrEntryCap          = backend.ErrEntryCap
	ErrRuleNotFound      = backend.ErrRuleNotFound
	ErrLimitsUnsupported = backend.ErrLimitsUnsupported
)

type (
	HandleRef   = backend.HandleRef
	HandleState = backend.HandleState
	Handle      = backend.Handle
	Proto       = backend.Proto
	PortRange   = backend.PortRange
	EgressRule  = backend.EgressRule
	Reason      = backend.Reason
	Event       = backend.Event
	Session     = backend.Session
	SweepStats  = backend.SweepStats
	Limits      = backend.Limits
	NeverEntry  = backend.NeverEntry
	Occupancy   = backend.Occupancy
	Denials     = backend.Denials
	Delta       = backend.Delta
)

const (
	HandleFree    = backend.HandleFree
	HandleLive    = backend.HandleLive
	HandleRevoked = backend.HandleRevoked
	HandleOnce    = backend.HandleOnce
	HandleUsed    = backend.HandleUsed

	ProtoAny = backend.ProtoAny
	ProtoTCP = backend.ProtoTCP
	ProtoUDP = backend.ProtoUDP

	ReasonNone           = backend.ReasonNone
	ReasonNoRule         = backend.ReasonNoRule
	ReasonHandleRevoked  = backend.ReasonHandleRevoked
	ReasonHandleExpired  = backend.ReasonHandleExpired
	ReasonRuleExpired    = backend.ReasonRuleExpired
	ReasonUnknownSession = backend.ReasonUnknownSession
	ReasonUnchecked      = backend.ReasonUnchecked
	ReasonFlowRevoked    = backend.ReasonFlowRevoked
	ReasonNoInbound      = backend.ReasonNoInbound
	ReasonSocketLimit    = backend.ReasonSocketLimit
	ReasonPortLimit      = backend.ReasonPortLimit
	ReasonForbidden      = backend.ReasonForbidden
	ReasonFSOutside      = backend.ReasonFSOutside
	ReasonFSDenied       = backend.ReasonFSDenied
	ReasonFSDepth        = backend.ReasonFSDepth
	NumReasons           = backend.NumReasons
)

// AnyPort matches every destination port.
var AnyPort = backend.AnyPort

// Port is the range holding exactly p.
func Port(p uint16) PortRange { return backend.Port(p) }

// ParseProto parses "tcp", "udp" or "any".
func ParseProto(s string) (Proto, error) { return backend.ParseProto(s) }
