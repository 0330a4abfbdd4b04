package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
)

// Kernel is the part of *dataplane.Dataplane the agent drives. The agent owns
// the dataplane's sessions and handle table: on start it revokes kernel
// handles and removes egress rules that its state does not account for.
type Kernel interface {
	CreateSession(name string) (dataplane.Session, error)
	DestroySession(name string) error
	Sessions() ([]dataplane.Session, error)
	NewHandle(parent dataplane.HandleRef, expires time.Time) (dataplane.HandleRef, error)
	Revoke(ref dataplane.HandleRef) error
	FreeHandle(ref dataplane.HandleRef) error
	Handles() ([]dataplane.Handle, error)
	AllowEgress(session string, r dataplane.EgressRule) error
	RemoveEgress(session string, r dataplane.EgressRule) error
	EgressRules(session string) ([]dataplane.EgressRule, error)
}

var _ Kernel = (*dataplane.Dataplane)(nil)

// ErrNotEnforceable is returned for a grant of a class this host cannot
// enforce: the grant is refused rather than issued as an advisory promise.
var ErrNotEnforceable = errors.New("agent: the host cannot enforce this capability class")

// Enforcement says how one class is enforced on this host.
type Enforcement struct {
	Class      Class  `json:"class"`
	Grantable  bool   `json:"grantable"`
	Mechanism  string `json:"mechanism"`
	Limitation string `json:"limitation,omitempty"`
}

// EnforcementMatrix reports, per class, which mechanism enforces it here
// (principle 2 of DESIGN.md: honest degradation). Only classes with a kernel
// backend wired into the agent are grantable.
func EnforcementMatrix() []Enforcement {
	out := make([]Enforcement, 0, len(Classes))
	for _, c := range Classes {
		e := Enforcement{Class: c}
		switch c {
		case ClassNetEgress:
			e.Grantable = true
			e.Mechanism = "BPF cgroup/connect4|6 + sendmsg4|6 egress maps keyed by session and prefix, checked against the grant's caretaker handle at use time"
			e.Limitation = "domains are enforced through the allowlisting DNS resolver the daemon runs: each answer's addresses enter the egress maps (with the record's TTL) before the answer is returned; an Agent used without that resolver opens nothing for a domain"
		case ClassFSScope:
			e.Mechanism = "none wired (Landlock ABI 7 is present on this kernel but the agent does not drive it yet)"
		case ClassClipboard:
			e.Mechanism = "none (clipboard is a desktop-substrate control; no host backend)"
		case ClassGPU:
			e.Mechanism = "none wired (cgroup/dev programs load here; GPU device grants and NVML metering are not wired, and an unmetered device class is not grantable)"
		case ClassInstall:
			e.Mechanism = "none wired (capability bounding set broker not implemented)"
		case ClassPersistence:
			e.Mechanism = "none wired (overlay/bind-mount scope not implemented)"
		case ClassCredentials:
			e.Mechanism = "none wired (the credential broker / TLS-inspecting proxy is not implemented)"
		case ClassPeripheral:
			e.Mechanism = "none wired (device cgroup rules for camera/mic/usb not implemented)"
		}
		out = append(out, e)
	}
	return out
}

func enforceable(c Class) error {
	for _, e := range EnforcementMatrix() {
		if e.Class == c {
			if !e.Grantable {
				return fmt.Errorf("%w: %s: %s", ErrNotEnforceable, c, e.Mechanism)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %s", ErrNotEnforceable, c)
}

// egressRules compiles a net.egress capability into kernel rules: every
// cidr × every port range (any port when none), any transport, all carried by
// the grant's handle. Domains compile to nothing here (see Enforcement).
func egressRules(c Capability, ref dataplane.HandleRef) []dataplane.EgressRule {
	c = c.Normalized()
	if c.Class != ClassNetEgress {
		return nil
	}
	ports := []dataplane.PortRange{dataplane.AnyPort}
	if len(c.Egress.Ports) > 0 {
		ports = ports[:0]
		for _, p := range c.Egress.Ports {
			ports = append(ports, dataplane.PortRange{Lo: p.Lo, Hi: p.Hi})
		}
	}
	var out []dataplane.EgressRule
	for _, p := range c.Egress.CIDRs {
		for _, pr := range ports {
			out = append(out, dataplane.EgressRule{Prefix: p, Proto: dataplane.ProtoAny, Ports: pr, Handle: ref})
		}
	}
	return out
}

func sameRule(a, b dataplane.EgressRule) bool {
	return a.Prefix == b.Prefix && a.Proto == b.Proto && a.Ports == b.Ports && a.Handle == b.Handle
}
