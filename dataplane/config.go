package dataplane

import (
	"fmt"
	"github.com/shinken-agent/shinken/agent/backend"
	"path/filepath"
	"regexp"
	"time"

	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// Config says where the dataplane lives and how large its maps are. The zero
// value is the product's defaults.
type Config struct {
	// CgroupRoot is the cgroup2 mount point; empty means "find it in
	// /proc/self/mountinfo".
	CgroupRoot string
	// Parent is the sessions' parent cgroup, relative to CgroupRoot
	// (default "shinken"). Programs are attached here, once.
	Parent string
	// PinPath is the bpffs directory holding programs' links and maps
	// (default /sys/fs/bpf/shinken).
	PinPath string

	MaxSessions    uint32 // default 65536
	MaxHandles     uint32 // default 262144
	MaxEgress4     uint32 // IPv4 entries, all sessions together, in each of the prefix trie and the exact-address hash; default 2097152
	MaxEgress6     uint32 // IPv6 entries likewise; default 1048576
	MaxFlows       uint32 // flow verdicts cached (LRU), all sessions; default 262144
	EventRingBytes uint32 // default 1 MiB; power of two
	// MaxDNSEntries caps each session's DNS-derived entries (those holding
	// a rule with an expiry, see AllowEgress); a new one past it is refused
	// with ErrEntryCap. Default DefaultMaxDNSEntries.
	MaxDNSEntries uint32
	// MaxSocketsPerSession caps each session's open inet sockets (counted
	// in the kernel at socket creation, bpf/quota.bpf.h): past it socket()
	// fails with EPERM. Default DefaultMaxSocketsPerSession.
	MaxSocketsPerSession uint32
	// MaxPortsPerSession caps the port holds of each session's sockets
	// (sweep mode: one per bound, listening or unconnected-sending socket):
	// past it bind() and the unconnected send fail with EPERM, a listen on
	// an autobound port is reported. Default DefaultMaxPortsPerSession.
	MaxPortsPerSession uint32
	// DenialEventRate and DenialEventBurst are each session's budget of
	// denial events (bpf/events.bpf.h): at most DenialEventBurst at once
	// and DenialEventRate a second after that reach the event ring, from
	// all its processes and CPUs together; the denials past it are still
	// counted (Counters) and the events not sent are counted too
	// (EventsSuppressed). Defaults DefaultDenialEventRate and
	// DefaultDenialEventBurst.
	DenialEventRate  uint32
	DenialEventBurst uint32
	// ExpiryInterval is how often the collector removes rules past their
	// expiry (the kernel already ignores them). Default 1s; at most 1m.
	ExpiryInterval time.Duration
	// FlowMode is how flows already open are cut when their authority dies
	// (default FlowAuto: sweep where the kernel can, else packet).
	FlowMode FlowMode
	// Boundary, when set, gives every session its own uid, PID, mount and
	// IPC namespaces, and starts every session process through the
	// boundary's launcher (package boundary). The daemon always sets it.
	Boundary *boundary.Config
	noAttach bool // tests of load and map logic only
	// storedCount loads the socket count's fallback (every count kept in
	// socket storage, bpf/quota.bpf.h) whatever the probe says: tests.
	storedCount bool
}

// FlowMode is how open flows are cut when the grant they were opened under
// dies (a revoke, a parent's revoke, a handle deadline).
type FlowMode uint32

const (
	// FlowAuto picks FlowSweep when the kernel has the bpf_sock_destroy
	// kfunc (Linux 6.5+), else FlowPacket. The chosen mode is reported by
	// Dataplane.FlowMode.
	FlowAuto FlowMode = 0
	// FlowSweep: after a revoke (of a handle a flow check tried:
	// flowmark_linux.go) and at each handle deadline, socket iterators
	// destroy every session socket whose peer no live grant covers (the
	// application sees ECONNABORTED; TCP peers get a reset). New connects are
	// checked at connect/sendmsg, a handshake racing a revoke by the revoke's
	// follow-up sweeps; no hook runs per data packet.
	FlowSweep FlowMode = 1
	// FlowPacket: cgroup_skb programs check every data packet of a session
	// socket against the handle its flow was allowed under and drop it once
	// that handle is dead. Works without the agent (deadlines included), at
	// the cost of hooks on every packet.
	FlowPacket FlowMode = 2
)

func (m FlowMode) String() string {
	switch m {
	case FlowAuto:
		return "auto"
	case FlowSweep:
		return "sweep"
	case FlowPacket:
		return "packet"
	}
	return fmt.Sprintf("FlowMode(%d)", uint32(m))
}

// ParseFlowMode reads "auto", "sweep" or "packet".
func ParseFlowMode(s string) (FlowMode, error) {
	switch s {
	case "", "auto":
		return FlowAuto, nil
	case "sweep":
		return FlowSweep, nil
	case "packet":
		return FlowPacket, nil
	}
	return 0, fmt.Errorf("dataplane config: flow mode %q: want auto, sweep or packet", s)
}

const (
	DefaultParent        = "shinken"
	DefaultPinPath       = "/sys/fs/bpf/shinken"
	DefaultMaxDNSEntries = 4096

	DefaultMaxSocketsPerSession = 4096
	DefaultMaxPortsPerSession   = 1024

	// A session's denial events a second, and at once: far more than a
	// program that meets a refusal and reports it ever makes, far less
	// than a flood of refused sends (hundreds of thousands a second) that
	// would otherwise all go to the agent.
	DefaultDenialEventRate  = 100
	DefaultDenialEventBurst = 500
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

func (c *Config) setDefaults() {
	if c.Parent == "" {
		c.Parent = DefaultParent
	}
	if c.PinPath == "" {
		c.PinPath = DefaultPinPath
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 65536
	}
	if c.MaxHandles == 0 {
		c.MaxHandles = 262144
	}
	if c.MaxEgress4 == 0 {
		c.MaxEgress4 = 2 << 20
	}
	if c.MaxEgress6 == 0 {
		c.MaxEgress6 = 1 << 20
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = 262144
	}
	if c.EventRingBytes == 0 {
		c.EventRingBytes = 1 << 20
	}
	if c.MaxDNSEntries == 0 {
		c.MaxDNSEntries = DefaultMaxDNSEntries
	}
	if c.MaxSocketsPerSession == 0 {
		c.MaxSocketsPerSession = DefaultMaxSocketsPerSession
	}
	if c.MaxPortsPerSession == 0 {
		c.MaxPortsPerSession = DefaultMaxPortsPerSession
	}
	if c.DenialEventRate == 0 {
		c.DenialEventRate = DefaultDenialEventRate
	}
	if c.DenialEventBurst == 0 {
		c.DenialEventBurst = DefaultDenialEventBurst
	}
	if c.ExpiryInterval == 0 {
		c.ExpiryInterval = time.Second
	}
	if c.Boundary != nil {
		b := *c.Boundary
		b.SetDefaults()
		c.Boundary = &b
	}
}

func (c *Config) validate() error {
	if !nameRE.MatchString(c.Parent) {
		return fmt.Errorf("dataplane config: parent cgroup %q: want 1-64 of [A-Za-z0-9_.-], not starting with . or -", c.Parent)
	}
	if !filepath.IsAbs(c.PinPath) {
		return fmt.Errorf("dataplane config: pin path %q is not absolute", c.PinPath)
	}
	if c.MaxSessions < 2 || c.MaxSessions > 1<<23 {
		return fmt.Errorf("dataplane config: max sessions %d out of [2, 2^23]", c.MaxSessions)
	}
	if c.MaxHandles < 2 {
		return fmt.Errorf("dataplane config: max handles %d < 2", c.MaxHandles)
	}
	if c.Boundary != nil {
		if err := c.Boundary.Validate(c.MaxSessions); err != nil {
			return fmt.Errorf("dataplane config: %w", err)
		}
	}
	if c.MaxDNSEntries > 1<<22 {
		return fmt.Errorf("dataplane config: max DNS entries per session %d out of [1, 2^22]", c.MaxDNSEntries)
	}
	if c.MaxSocketsPerSession > 1<<20 || c.MaxPortsPerSession > 1<<16 {
		return fmt.Errorf("dataplane config: sockets per session %d out of [1, 2^20] or ports per session %d out of [1, 65536]", c.MaxSocketsPerSession, c.MaxPortsPerSession)
	}
	if c.DenialEventRate > 1e6 || c.DenialEventBurst > 1e6 {
		return fmt.Errorf("dataplane config: denial events per session %d a second, burst %d: each out of [1, 1000000]", c.DenialEventRate, c.DenialEventBurst)
	}
	if c.ExpiryInterval < 10*time.Millisecond || c.ExpiryInterval > time.Minute {
		return fmt.Errorf("dataplane config: expiry interval %s out of [10ms, 1m]", c.ExpiryInterval)
	}
	if c.FlowMode > FlowPacket {
		return fmt.Errorf("dataplane config: unknown flow mode %d", c.FlowMode)
	}
	if c.EventRingBytes < 4096 || c.EventRingBytes&(c.EventRingBytes-1) != 0 {
		return fmt.Errorf("dataplane config: event ring size %d is not a power of two >= 4096", c.EventRingBytes)
	}
	return nil
}

// Check validates c (with its defaults filled in) without opening anything.
func (c Config) Check() error {
	c.setDefaults()
	return c.validate()
}

// ValidSessionName reports whether name can name a session cgroup.
func ValidSessionName(name string) error { return backend.ValidSessionName(name) }
