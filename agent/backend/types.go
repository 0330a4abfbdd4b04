package backend

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Sentinel errors. Every error a backend returns for bad input wraps one of
// these, and a call that fails leaves the kernel as it was.
var (
	ErrNotSupported    = errors.New("backend: not supported on this platform")
	ErrSessionNotFound = errors.New("dataplane: unknown session")
	ErrSessionExists   = errors.New("dataplane: session already exists")
	ErrInvalidSession  = errors.New("dataplane: invalid session") // its name, workspace or limits
	ErrInvalidPrefix   = errors.New("dataplane: invalid prefix")
	ErrInvalidPorts    = errors.New("dataplane: invalid port range")
	ErrInvalidProto    = errors.New("dataplane: invalid protocol")
	ErrInvalidHandle   = errors.New("dataplane: invalid handle reference")
	ErrHandleNotLive   = errors.New("dataplane: handle is not live")
	// ErrHandleLive refuses to release what a live handle holds: revoke it
	// first.
	ErrHandleLive   = errors.New("dataplane: handle is live; revoke it first")
	ErrChainTooDeep = errors.New("dataplane: handle parent chain too deep")
	ErrMapFull      = errors.New("dataplane: map full")
	ErrRulesFull    = errors.New("dataplane: too many rules on one prefix")
	ErrCoverTooDeep = errors.New("dataplane: too many nested prefixes cover this one")
	ErrRuleNotFound = errors.New("dataplane: no such egress rule")
	// ErrEntryCap: the session already holds its cap of DNS-derived entries
	// (rules with an expiry, written by AllowEgress).
	ErrEntryCap = errors.New("dataplane: session's DNS-derived entry cap reached")
	// ErrLimitsUnsupported is returned when the host cannot enforce a quota
	// (on hybrid cgroup hosts the controllers sit on v1).
	ErrLimitsUnsupported = errors.New("dataplane: quota not enforceable on this host")
	// ErrExecFailed: a launch's last step, the execve of the program the
	// request names, failed for the program's sake (no such file, not a
	// program, a loop of links, arguments too long): the request's fault.
	ErrExecFailed = errors.New("backend: the program could not be executed")
	// ErrExecDenied: that execve was refused (EACCES, EPERM: the file's
	// mode, a noexec mount, the session's exec allowlist).
	ErrExecDenied = errors.New("backend: executing the program was refused")
)

// validSessionName says whether name is 1-64 of [A-Za-z0-9_.-], not
// starting with . or - (what the regular expression
// ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$ matches: TestValidSessionNameAsRegexp).
// A loop, not a regexp compiled at init: every binary that links this
// package paid the compile (861 allocations, about 1 ms on a loaded
// 2-vCPU VM) at start, the session runtime's shim once per process
// (bench/README.md, issue 20).
func validSessionName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_':
		case (c == '.' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// cgroupFilePrefixes are the prefixes of cgroup v2 interface files (the
// core's and each controller's), which sit in the same directory as the
// session cgroups: a session may not be named like one.
var cgroupFilePrefixes = []string{"cgroup", "cpu", "cpuset", "io", "memory", "pids", "rdma", "hugetlb", "misc", "irq"}

// ValidSessionName reports whether name can name a session.
func ValidSessionName(name string) error {
	if !validSessionName(name) {
		return fmt.Errorf("%w: %q: invalid name: want 1-64 of [A-Za-z0-9_.-], not starting with . or -", ErrInvalidSession, name)
	}
	if head, _, dotted := strings.Cut(name, "."); dotted && slices.Contains(cgroupFilePrefixes, head) {
		return fmt.Errorf("%w: %q: invalid name: cgroup interface files (%s.*) share the sessions' directory", ErrInvalidSession, name, head)
	}
	return nil
}

// Session is one session the backend knows.
type Session struct {
	Name     string `json:"name"`
	Index    uint32 `json:"index"`     // dense kernel index; 0 is never a session
	CgroupID uint64 `json:"cgroup_id"` // the cgroup2 id of Path
	Path     string `json:"path"`      // the cgroup2 directory
}

// HandleRef names one caretaker handle in the kernel handle table: a slot and
// the generation the slot had when the handle was issued. A reference whose
// generation no longer matches the slot is dead, so a recycled slot never
// revives an old reference. The zero value means "no handle" (slot 0 is never
// issued).
type HandleRef struct {
	Slot       uint32 `json:"slot"`
	Generation uint32 `json:"generation"`
}

// IsZero reports whether r is the null reference.
func (r HandleRef) IsZero() bool { return r.Slot == 0 }

func (r HandleRef) String() string { return fmt.Sprintf("%d.%d", r.Slot, r.Generation) }

// Reaches says whether a revoke of dead kills ref: dead is ref or one of its
// ancestors, walked with parent (ref's parent, and false when ref's slot no
// longer holds ref's generation) at most maxChain steps. A recycled slot on
// the way, or a chain longer than maxChain, counts as reached: the caller
// then does the revoke's work for ref too, which is never wrong, only work.
func Reaches(ref, dead HandleRef, maxChain int, parent func(HandleRef) (HandleRef, bool)) bool {
	for range maxChain + 1 {
		if ref.IsZero() {
			return false
		}
		up, ok := parent(ref)
		if !ok || ref == dead {
			return true
		}
		ref = up
	}
	return true
}

// HandleState is the state word of a handle slot.
type HandleState uint32

const (
	HandleFree    HandleState = 0
	HandleLive    HandleState = 1
	HandleRevoked HandleState = 2
	// HandleOnce is an approve-once handle not used yet: the first allowed
	// connect or send under it moves it to HandleUsed, in the kernel, with
	// one compare-and-swap (two racing connects: exactly one wins).
	HandleOnce HandleState = 3
	// HandleUsed is a once handle whose one use is spent: the flow it opened
	// lives on (until revoke or expiry), no new use passes.
	HandleUsed HandleState = 4
)

// Alive reports whether a handle in this state still holds authority (for
// new uses, or only for the flow its one use opened).
func (s HandleState) Alive() bool { return s == HandleLive || s == HandleOnce || s == HandleUsed }

func (s HandleState) String() string {
	switch s {
	case HandleFree:
		return "free"
	case HandleLive:
		return "live"
	case HandleRevoked:
		return "revoked"
	case HandleOnce:
		return "once"
	case HandleUsed:
		return "used"
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// Handle is one slot of the kernel handle table as user space sees it.
type Handle struct {
	Ref     HandleRef
	State   HandleState
	Parent  HandleRef // zero for a root handle
	Expires time.Time // zero: never
}

// Proto selects the transport an egress rule applies to.
type Proto uint8

const (
	ProtoAny Proto = 0
	ProtoTCP Proto = 6
	ProtoUDP Proto = 17
)

func (p Proto) String() string {
	switch p {
	case ProtoAny:
		return "any"
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// ParseProto parses "tcp", "udp" or "any".
func ParseProto(s string) (Proto, error) {
	switch s {
	case "tcp":
		return ProtoTCP, nil
	case "udp":
		return ProtoUDP, nil
	case "any", "":
		return ProtoAny, nil
	}
	return 0, fmt.Errorf("%w: %q (want tcp, udp or any)", ErrInvalidProto, s)
}

// PortRange is an inclusive destination port range. The zero value means any
// port. A single port p is {p, p}. Port 0 is never part of an explicit range.
type PortRange struct {
	Lo, Hi uint16
}

// AnyPort matches every destination port.
var AnyPort = PortRange{}

// Port is the range holding exactly p.
func Port(p uint16) PortRange { return PortRange{p, p} }

// IsAny reports whether r matches every port.
func (r PortRange) IsAny() bool { return r.Lo == 0 && r.Hi == 0 }

// Validate checks the range.
func (r PortRange) Validate() error {
	if r.IsAny() {
		return nil
	}
	if r.Lo == 0 || r.Hi == 0 {
		return fmt.Errorf("%w: port 0 in range %d-%d", ErrInvalidPorts, r.Lo, r.Hi)
	}
	if r.Lo > r.Hi {
		return fmt.Errorf("%w: %d-%d is empty", ErrInvalidPorts, r.Lo, r.Hi)
	}
	return nil
}

func (r PortRange) String() string {
	switch {
	case r.IsAny():
		return "*"
	case r.Lo == r.Hi:
		return fmt.Sprintf("%d", r.Lo)
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// EgressRule allows a session to reach Prefix with Proto on Ports while Handle
// (and every ancestor of it) is live and unexpired, and, when Expires is set,
// until Expires (DNS-derived entries carry the record's TTL here).
type EgressRule struct {
	Prefix  netip.Prefix
	Proto   Proto
	Ports   PortRange
	Handle  HandleRef
	Expires time.Time // zero: the rule itself never expires
	// NeverOK lets the rule reach never-listed destinations (NeverEntry)
	// it covers; without it they stay refused whatever the rule covers.
	NeverOK bool
	// Inbound turns the rule around: it admits peers in Prefix opening a
	// flow to the session's own Ports (a TCP connection to a listener, a
	// datagram to an unconnected UDP socket), and never allows a connect
	// or send. New inbound flows are refused unless such a rule covers them
	// under a live handle; an accepted TCP flow then lives while its rule
	// (or an egress rule covering the peer) does.
	Inbound bool
}

func (r EgressRule) String() string {
	s := fmt.Sprintf("%s %s/%s handle=%s", r.Prefix, r.Proto, r.Ports, r.Handle)
	if r.NeverOK {
		s += " never-ok"
	}
	if r.Inbound {
		s = "inbound from " + s
	}
	return s
}

// SameRule reports whether a and b are the same kernel entry (the expiry
// aside).
func SameRule(a, b EgressRule) bool {
	return a.Prefix == b.Prefix && a.Proto == b.Proto && a.Ports == b.Ports && a.Handle == b.Handle && a.NeverOK == b.NeverOK && a.Inbound == b.Inbound
}

// NeverEntry is one destination of the never-list: refused in the kernel
// before any grant is consulted (a 0.0.0.0/0 grant does not reach it), unless
// the allowing rule is NeverOK. Port 0: every port.
type NeverEntry struct {
	Prefix netip.Prefix
	Port   uint16
}

func (n NeverEntry) String() string {
	if n.Port == 0 {
		return n.Prefix.String()
	}
	return fmt.Sprintf("%s port %d", n.Prefix, n.Port)
}

// DefaultNeverList is what every backend refuses from the start: link-local
// addresses (where the cloud metadata services live: 169.254.169.254,
// 169.254.170.2, ...), AWS's IPv6 metadata address and IPv6 link-local. The
// daemon adds its own listeners.
var DefaultNeverList = []NeverEntry{
	{Prefix: netip.MustParsePrefix("169.254.0.0/16")},
	{Prefix: netip.MustParsePrefix("fd00:ec2::254/128")},
	{Prefix: netip.MustParsePrefix("fe80::/10")},
	{Prefix: netip.MustParsePrefix("100.100.100.200/32")}, // Alibaba Cloud metadata
}

// Validate checks the rule's shape (not whether its session or handle exist).
func (r EgressRule) Validate() error {
	if !r.Prefix.IsValid() {
		return fmt.Errorf("%w: %v", ErrInvalidPrefix, r.Prefix)
	}
	if r.Prefix.Addr().Zone() != "" {
		return fmt.Errorf("%w: %v has a zone", ErrInvalidPrefix, r.Prefix)
	}
	if r.Prefix.Masked() != r.Prefix {
		return fmt.Errorf("%w: %v has host bits set (did you mean %v?)", ErrInvalidPrefix, r.Prefix, r.Prefix.Masked())
	}
	if r.Prefix.Addr().Is4In6() {
		return fmt.Errorf("%w: %v is IPv4-mapped IPv6; use the IPv4 form", ErrInvalidPrefix, r.Prefix)
	}
	switch r.Proto {
	case ProtoAny, ProtoTCP, ProtoUDP:
	default:
		return fmt.Errorf("%w: %d", ErrInvalidProto, r.Proto)
	}
	if err := r.Ports.Validate(); err != nil {
		return err
	}
	if r.Handle.IsZero() {
		return fmt.Errorf("%w: rule without a handle", ErrInvalidHandle)
	}
	if r.Inbound && r.NeverOK {
		return fmt.Errorf("%w: an inbound rule is no never-list exception", ErrInvalidPrefix)
	}
	return nil
}

// Reason says why the kernel denied something. The values are the kernel ABI
// (enum shk_reason in bpf/shinken_api.bpf.h).
type Reason uint32

const (
	ReasonNone           Reason = 0
	ReasonNoRule         Reason = 1  // no entry matches destination, protocol and port
	ReasonHandleRevoked  Reason = 2  // an entry matched but its handle or an ancestor is revoked
	ReasonHandleExpired  Reason = 3  // an entry matched but its handle or an ancestor expired
	ReasonRuleExpired    Reason = 4  // an entry matched but the entry's own expiry (DNS TTL) passed
	ReasonUnknownSession Reason = 5  // the socket's cgroup is under the parent but is no session
	ReasonUnchecked      Reason = 6  // a packet that no connect/sendmsg check covered (raw, ICMP, unchecked SYN)
	ReasonFlowRevoked    Reason = 7  // a packet of a flow whose handle died after connect
	ReasonNoInbound      Reason = 8  // a new inbound flow (SYN to a listener, datagram to an unconnected socket) no inbound grant admits
	ReasonForbidden      Reason = 9  // the deny table: an admin or hard-deny forbid names the destination (DenyEntry)
	ReasonSocketLimit    Reason = 10 // a socket past the session's socket limit (HostConfig.SessionMaxSockets)
	ReasonPortLimit      Reason = 11 // a bind, listen or unconnected send past the session's bound-port limit (HostConfig.SessionMaxPorts)
	ReasonFSOutside      Reason = 12 // fs.scope (BPF LSM): no live file entry covers the path and the session's outside access lacks the access
	ReasonFSDenied       Reason = 13 // fs.scope (BPF LSM): the nearest file entry with a live rule is a deny, or lacks the access
	ReasonFSDepth        Reason = 14 // fs.scope (BPF LSM): no entry within the walk's bound (16 dentries) and the filesystem's root not reached
	ReasonExecDenied     Reason = 15 // process: the exec gate refused an exec-open of a gated session's task (a program off its allowlist, or its ELF interpreter out of turn); counted by the BPF LSM program (bpf/exec.bpf.c) where it is attached, else by the agent (the fanotify gate)
	NumReasons                  = 16
)

var reasonNames = [...]string{"none", "no_rule", "handle_revoked", "handle_expired", "rule_expired", "unknown_session", "unchecked", "flow_revoked", "no_inbound", "forbidden", "socket_limit", "port_limit", "fs_outside", "fs_denied", "fs_depth", "exec_denied"}

// Class is the capability class whose enforcement a denial of this reason
// is: net.inbound for no_inbound and port_limit (a port held is one the
// session can receive on), net.egress for every other reason today (a class
// whose hook denies adds its reasons, and its case here); fs.scope for the
// fs_* reasons of the BPF LSM programs; process for exec_denied.
func (r Reason) Class() Class {
	switch r {
	case ReasonNoInbound, ReasonPortLimit:
		return ClassNetInbound
	case ReasonFSOutside, ReasonFSDenied, ReasonFSDepth:
		return ClassFSScope
	case ReasonExecDenied:
		return ClassProcess
	}
	return ClassNetEgress
}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint32(r))
}

// Event is one denial reported (best effort) by the kernel.
type Event struct {
	Time     time.Time
	CgroupID uint64
	Session  uint32 // session index, 0 if unknown
	PID      uint32
	Comm     string
	Reason   Reason
	Proto    Proto
	Dst      netip.AddrPort
	// fs.scope denials (Reason.Class() == ClassFSScope) name the inode
	// refused (the kernel's device number, major<<20|minor) and the access
	// asked (1 read, 2 write, 4 delete, ORed); Proto and Dst are unset.
	// process denials (exec_denied) name the file refused the same way
	// (Dev, Inode) and its path as the agent read it from the refused
	// descriptor (Path: in the session's view; best effort, may be empty).
	Dev    uint32
	Inode  uint64
	Access uint8
	Path   string
}

// EventReader reads denial events. Read blocks until an event, the deadline
// or Close.
type EventReader interface {
	Read() (Event, error)
	SetDeadline(t time.Time)
	Close() error
}

// Limits are a session's resource quotas and its workspace. Zero fields are
// unset.
type Limits struct {
	MemoryBytes uint64 `json:"memory_bytes,omitempty"` // memory.max
	Pids        uint64 `json:"pids,omitempty"`         // pids.max
	CPUPercent  uint32 `json:"cpu_percent,omitempty"`  // cpu.max, percent of one CPU (100 = one whole CPU)
	// Workspace is the directory the session works in, made part of its
	// view with the session (all or nothing, as the quotas); nil: none.
	Workspace *Workspace `json:"workspace,omitempty"`
}

// Controllers names the cgroup controllers the set quotas need.
func (l Limits) Controllers() []string {
	var c []string
	if l.MemoryBytes > 0 {
		c = append(c, "memory")
	}
	if l.Pids > 0 {
		c = append(c, "pids")
	}
	if l.CPUPercent > 0 {
		c = append(c, "cpu")
	}
	return c
}

// IsZero reports whether no quota is set.
func (l Limits) IsZero() bool { return len(l.Controllers()) == 0 }

// SweepStats says how many flow sweeps ran, how many revokes and handle
// deadlines needed none (no flow check ever tried a rule under the handle
// or a descendant), how many sockets they
// destroyed, how many failed and the last error one met (nil if none).
type SweepStats struct {
	Sweeps    uint64
	Skipped   uint64
	Destroyed uint64
	Errors    uint64 // sweeps that failed (new connects stayed denied; open flows may live on)
	LastErr   error
}

// Occupancy is how full one kernel table is.
type Occupancy struct {
	Map     string `json:"map"`
	Entries int    `json:"entries"`
	Limit   int    `json:"limit"`
}
