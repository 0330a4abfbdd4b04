package policy

// The grammar's names, unqualified, as the engine's tests (moved here from
// package agent) use them; the engine itself writes capability.X.

import "github.com/shinken-agent/shinken/agent/capability"

type (
	Capability       = capability.Capability
	Class            = capability.Class
	ClipboardScope   = capability.ClipboardScope
	CredentialsScope = capability.CredentialsScope
	EgressScope      = capability.EgressScope
	FSScope          = capability.FSScope
	GPUScope         = capability.GPUScope
	InstallScope     = capability.InstallScope
	PeripheralScope  = capability.PeripheralScope
	PersistenceScope = capability.PersistenceScope
	PortRange        = capability.PortRange
	SessionAttrs     = capability.SessionAttrs
	Tier             = capability.Tier
	UseRequest       = capability.UseRequest
)

const (
	ClassClipboard   = capability.ClassClipboard
	ClassCredentials = capability.ClassCredentials
	ClassFSScope     = capability.ClassFSScope
	ClassGPU         = capability.ClassGPU
	ClassInstall     = capability.ClassInstall
	ClassNetEgress   = capability.ClassNetEgress
	ClassNetInbound  = capability.ClassNetInbound
	ClassPeripheral  = capability.ClassPeripheral
	ClassPersistence = capability.ClassPersistence

	FirstParty       = capability.FirstParty
	GPUModeCompute   = capability.GPUModeCompute
	InstallAny       = capability.InstallAny
	InstallPkg       = capability.InstallPkg
	LifecycleSession = capability.LifecycleSession
	TierAsk          = capability.TierAsk
	TierBlock        = capability.TierBlock
	TierNotify       = capability.TierNotify
)

var (
	Classes           = capability.Classes
	ErrUnknownSession = capability.ErrUnknownSession
)
