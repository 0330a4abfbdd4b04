package backend

import (
	"fmt"
	"os/exec"
	"slices"
	"time"
)

// Level is how strongly a host enforces a capability class or a boundary
// mechanism, in the one vocabulary of the design.
type Level string

const (
	// RevocableInKernel: revoking is a map write; the next use fails and
	// open flows or files are cut too.
	RevocableInKernel Level = "revocable in-kernel"
	// RevocableAtNextUse: the next connect/open/exec fails; objects already
	// open live on.
	RevocableAtNextUse Level = "revocable at next use"
	// FixedAtExec: applied when a process starts; a change reaches new
	// processes only.
	FixedAtExec Level = "fixed at exec"
	// Unavailable: not enforced here; grants of the class are refused.
	Unavailable Level = "unavailable"
)

// Class names a capability class: the one typed enum of class names for
// the whole tree (the grammar, the registry, the backends' probe rows).
// The zero value is not a class.
type Class string

// The classes of the grammar (seeds/permissions.md §3.1), plus net.inbound.
const (
	ClassNetEgress   Class = "net.egress"
	ClassNetInbound  Class = "net.inbound"
	ClassFSScope     Class = "fs.scope"
	ClassClipboard   Class = "clipboard"
	ClassGPU         Class = "gpu"
	ClassInstall     Class = "install.privileged"
	ClassPersistence Class = "persistence"
	ClassCredentials Class = "credentials"
	ClassPeripheral  Class = "peripheral"
	ClassProcess     Class = "process"
)

// classes is Classes as an array, so that NumClasses is a constant.
var classes = [...]Class{ClassNetEgress, ClassNetInbound, ClassFSScope, ClassClipboard, ClassGPU, ClassInstall, ClassPersistence, ClassCredentials, ClassPeripheral, ClassProcess}

// NumClasses is len(Classes), a constant: per-class tables may be arrays.
const NumClasses = len(classes)

// Classes lists the classes in the seed's order, net.inbound after
// net.egress.
var Classes = classes[:]

// Enforceable reports whether the level enforces anything.
func (l Level) Enforceable() bool { return l != Unavailable && l != "" }

// Strength says how one capability class (or one mechanism of the session
// boundary) is enforced on this host, as probed when the backend opened.
type Strength struct {
	Class     Class  `json:"class"`
	Level     Level  `json:"level"`
	Mechanism string `json:"mechanism"`
	// Reason says why the level is not stronger (for Unavailable: why the
	// class is refused). Empty when nothing is missing.
	Reason string `json:"reason,omitempty"`
}

// Report is what a backend found on this host when it opened: one Strength
// per capability class it knows of, the session boundary's mechanisms, and
// facts about its own installation.
type Report struct {
	OS      string     `json:"os"`
	Backend string     `json:"backend"`
	Classes []Strength `json:"classes"`
	// Boundary lists the mechanisms that keep one session from using
	// another's authority (uid, namespaces, seccomp, Landlock...).
	Boundary []Strength `json:"boundary,omitempty"`
	// Facts are probed host facts (kernel, flow mode, cgroup parent...).
	Facts map[string]string `json:"facts,omitempty"`
}

// Class returns the strength reported for class c, Unavailable if the
// backend does not name it.
func (r Report) Class(c Class) Strength {
	for _, s := range r.Classes {
		if s.Class == c {
			return s
		}
	}
	return Strength{Class: c, Level: Unavailable, Mechanism: "none", Reason: "the " + r.Backend + " backend has no mechanism for this class"}
}

// Delta is the OS state of one grant: one section per capability class
// the backend enforces. A grant compiles to exactly one Delta; the agent
// persists it in the grant record, pushes it with one Apply and reclaims it
// with one Release, and reconcile compares it, section by section, with the
// backend's Snapshot. A class that lands adds its section here (files,
// devices, budgets, credentials next), a table in each backend and a row in
// each backend's probe.
type Delta struct {
	// Egress is the net.egress section: destinations the session may reach.
	Egress []EgressRule `json:"egress,omitempty"`
	// Inbound is the net.inbound section: peers that may open flows to the
	// session's own ports (every rule has Inbound set).
	Inbound []EgressRule `json:"inbound,omitempty"`
	// Files is the fs.scope section: paths the session may read, write or
	// delete, and those it is denied (files.go).
	Files []FileEntry `json:"files,omitempty"`
	// Process is the process section: programs the session may execute
	// and its process bound (process.go).
	Process []ProcessEntry `json:"process,omitempty"`
}

// IsEmpty reports whether the delta holds nothing.
func (d Delta) IsEmpty() bool {
	return len(d.Egress) == 0 && len(d.Inbound) == 0 && len(d.Files) == 0 && len(d.Process) == 0
}

// AddressRules returns the rules of the sections that live in the address
// tables (egress, then inbound), in order.
func (d Delta) AddressRules() []EgressRule {
	return append(append(make([]EgressRule, 0, len(d.Egress)+len(d.Inbound)), d.Egress...), d.Inbound...)
}

// Validate checks every section's shape: each rule valid, inbound rules
// only in the inbound section, no entry named twice.
func (d Delta) Validate() error {
	all := d.AddressRules()
	for i, r := range all {
		if slices.ContainsFunc(all[:i], func(o EgressRule) bool { return SameRule(o, r) }) {
			return fmt.Errorf("%w: %s: the delta names this entry twice", ErrInvalidPrefix, r)
		}
	}
	for _, r := range d.Egress {
		if r.Inbound {
			return fmt.Errorf("%w: %s: an inbound rule in the egress section", ErrInvalidPrefix, r)
		}
		if err := r.Validate(); err != nil {
			return err
		}
	}
	for _, r := range d.Inbound {
		if !r.Inbound {
			return fmt.Errorf("%w: %s: an egress rule in the inbound section", ErrInvalidPrefix, r)
		}
		if err := r.Validate(); err != nil {
			return err
		}
	}
	if err := fileEntriesValid(d.Files); err != nil {
		return err
	}
	return processEntriesValid(d.Process)
}

// Missing names the first entry of d that have does not hold, section by
// section ("" when have holds all of d). Reconcile uses it to find a live
// grant whose OS state drifted.
func (d Delta) Missing(have Delta) string {
	sections := []struct {
		name       string
		want, have []EgressRule
	}{{"egress", d.Egress, have.Egress}, {"inbound", d.Inbound, have.Inbound}}
	for _, s := range sections {
		for _, r := range s.want {
			if !slices.ContainsFunc(s.have, func(k EgressRule) bool { return SameRule(k, r) }) {
				return s.name + " " + r.String()
			}
		}
	}
	if m := missingFile(d.Files, have.Files); m != "" {
		return m
	}
	return missingProcess(d.Process, have.Process)
}

// DeltaOf sorts address rules into their sections.
func DeltaOf(rules []EgressRule) Delta {
	var d Delta
	for _, r := range rules {
		if r.Inbound {
			d.Inbound = append(d.Inbound, r)
		} else {
			d.Egress = append(d.Egress, r)
		}
	}
	return d
}

// LaunchOptions says who a session process runs as.
type LaunchOptions struct {
	// UID and GID of the process; both zero means the session's own
	// identity, and a backend with session identities (SessionIdentity)
	// refuses any other.
	UID, GID uint32
	// Privileged keeps the caller's credentials (root). Only for tests of
	// what a privileged process could do; never the default.
	Privileged bool
}

// Ops counts the kernel operations a backend performed since it opened: the
// handle-state writes that revoke (each one cuts a whole subtree), the sweeps
// that cut open flows before Revoke returns, and the follow-up sweeps that
// run after revokes (the Linux backend's catch the UDP sockets that finish
// connecting just after a revoke; a burst of revokes shares them). Tests use
// it to hold the revoke path to one write and one sweep: follow-ups run
// later, on the backend's own schedule, and are counted apart.
type Ops struct {
	RevokeWrites   uint64 `json:"revoke_writes"`
	Sweeps         uint64 `json:"sweeps"`
	FollowUpSweeps uint64 `json:"follow_up_sweeps"`
	// ViewSweeps: file view changes run by revokes (the Linux backend's
	// mount view, fs.scope's sweep: at most one per revoke).
	ViewSweeps uint64 `json:"view_sweeps"`
}

// Snapshot is what a backend holds, read in one pass: its sessions, its
// handle table, and per session the Delta entries in force (each rule
// carries its handle). Reconcile compares it with the agent's records.
type Snapshot struct {
	Sessions []Session
	Handles  []Handle
	// Deltas maps a session name to what the backend enforces for it; a
	// session with nothing has no entry.
	Deltas map[string]Delta
}

// Denials counts a session's kernel denials by Reason (index = Reason).
type Denials [NumReasons]uint64

// Prober reports what a backend found on this host.
type Prober interface {
	// Probe returns what the backend found on this host when it opened.
	Probe() Report
}

// Sessions is the session role. A session is the unit of authority:
// created empty (it can do nothing that needs a grant) with its quotas,
// ended with everything in it killed.
type Sessions interface {
	// CreateSession makes a session with the quotas in l, all or nothing:
	// a quota the host cannot enforce fails the call (wrapping
	// ErrLimitsUnsupported) and leaves nothing behind.
	CreateSession(name string, l Limits) (Session, error)
	DestroySession(name string) error
	Session(name string) (Session, error)
	SessionByIndex(index uint32) (Session, error)
	Sessions() ([]Session, error)
	// CheckLimits says whether every quota in l can be enforced here,
	// changing nothing.
	CheckLimits(l Limits) error
}

// Launcher is the one path by which a process enters a session.
type Launcher interface {
	Launch(session string, cmd *exec.Cmd, opts LaunchOptions) error
}

// Grants is the caretaker role: handles and the Deltas they carry.
type Grants interface {
	// NewHandle issues a live caretaker handle (a child of parent when
	// parent is not zero).
	NewHandle(parent HandleRef, expires time.Time) (HandleRef, error)
	// NewOnceHandle issues an approve-once handle (HandleOnce): the first
	// allowed use in the kernel consumes it atomically; a backend that
	// cannot consume at use time refuses it (ErrNotSupported), never
	// issues a many-use handle instead.
	NewOnceHandle(parent HandleRef, expires time.Time) (HandleRef, error)
	// Apply pushes a grant's Delta into session, all or nothing: when one
	// entry fails, those it added are taken back (an entry that was there
	// before the call stays).
	Apply(session string, d Delta) error
	// Revoke kills a handle and its whole subtree with one write and cuts
	// the flows that no live grant covers any more, at most one sweep,
	// before it returns; revoking a dead handle is a no-op.
	Revoke(ref HandleRef) error
	// Release reclaims what a dead grant held in session: the entries of d
	// (those already gone are no error), then ref's slot when ref is not
	// zero, with no further revoke write or sweep. ref, or an ancestor of
	// it, must already be revoked: otherwise Release changes nothing and
	// returns ErrHandleLive.
	Release(session string, ref HandleRef, d Delta) error
	// HandleState reads one handle's state word (an approve-once handle
	// reads HandleUsed once the kernel consumed it); a freed or recycled
	// slot is HandleFree.
	HandleState(ref HandleRef) (HandleState, error)
	// SetNeverList replaces the never-list (DefaultNeverList is in force
	// from the start): destinations refused before any grant is consulted.
	SetNeverList(entries []NeverEntry) error
	// SetDenyList replaces the deny table (empty from the start):
	// destinations refused before any grant and before the never-list and
	// its exceptions (ReasonForbidden). It writes only the entries that
	// change (DenyTable's, pushed down), and cuts the open flows to what
	// it newly refuses that no inbound rule covers. More than
	// MaxDenyEntries prefixes of one family is ErrMapFull, changing
	// nothing.
	SetDenyList(entries []DenyEntry) error
	// SetNeverOK makes the session's rule r (the one SameRule names, the
	// NeverOK flag aside) an exception to the never-list or not, as
	// r.NeverOK says: the agent re-derives every exception from the
	// admin policies in force at each policy change. Clearing it refuses
	// new uses at once; ErrRuleNotFound when the session holds no such
	// rule.
	SetNeverOK(session string, r EgressRule) error
	// Snapshot reads what the backend holds, for reconcile and status.
	Snapshot() (Snapshot, error)
}

// Telemetry is the denial and table telemetry role.
type Telemetry interface {
	// Counters returns a session's denial counts (never dependent on the
	// event ring keeping up); index 0 counts what no session owns.
	Counters(index uint32) (Denials, error)
	RingbufDrops() (uint64, error)
	SweepStats() SweepStats
	Occupancy() []Occupancy
	Ops() Ops
	Events() (EventReader, error)
}

// SuppressedEvents is what a backend with a per-session denial-event
// budget adds to Telemetry (the Linux dataplane: bpf/events.bpf.h): how
// many denial events each session's budget kept from Events (their denials
// are in Counters all the same), by session index and in all.
type SuppressedEvents interface {
	EventsSuppressed(index uint32) (uint64, error)
	EventsSuppressedTotal() (uint64, error)
}

// DNS is the resolver's role: every session DNS query goes to the agent's
// resolver, whose answers become rules.
type DNS interface {
	// SetDNSRedirect sends every session DNS query to the resolver on port
	// (0: off).
	SetDNSRedirect(port uint16) error
	DNSRedirect() (uint16, error)
	// AllowEgress adds one egress rule (answers become rules under the
	// grant's handle, with the record's TTL).
	AllowEgress(session string, r EgressRule) error
}

// Backend is one operating system's enforcement: the only way the control
// plane touches the OS, made of the roles above. Consumers take the role
// they use. Implementations are safe for concurrent use.
type Backend interface {
	Prober
	Sessions
	Launcher
	Grants
	Telemetry
	DNS
	// Close stops the backend's goroutines and closes its descriptors;
	// what is pinned keeps enforcing. Uninstall removes everything.
	Close() error
	Uninstall() error
}

// SessionIdentity is an optional role: a backend whose sessions run as an
// identity of their own (the Linux session boundary's uid) says which.
type SessionIdentity interface {
	SessionUID(session string) (uint32, error)
}

// SessionHolders is an optional role: a backend that keeps a process per
// session while (and only while) the session needs its namespaces (the
// Linux boundary's holder, started at the session's first launch) says
// whether it runs. The operator API shows it with each session.
type SessionHolders interface {
	HolderRunning(session string) (bool, error)
}

// WorkspaceViews is an optional role: a backend that makes a session's
// workspace (Limits.Workspace) part of its view puts it back where it is
// missing (a session whose view was remade while the agent was down);
// reconcile calls it for every active session with a workspace.
type WorkspaceViews interface {
	EnsureWorkspace(session string, w Workspace) error
}

// Config is what every backend is opened with; fields a backend does not
// use are ignored.
type Config struct {
	// CgroupParent names the directory under the cgroup2 mount holding one
	// directory per session.
	CgroupParent string
	// PinPath is the bpffs directory where programs and maps are pinned.
	PinPath string
	// FlowMode selects how open flows are cut on revoke ("auto", "sweep",
	// "packet").
	FlowMode string
	// MaxSessions is the most sessions live at once (it sizes the
	// per-session kernel tables); 0: the backend's default (Linux: 65536,
	// of which index 0 is never a session). A session past it fails to be
	// created with a clear error naming the limit.
	MaxSessions uint32
	// SessionUIDBase and SessionUIDCount reserve the uids (and gids) of
	// sessions; zero means the backend's default range.
	SessionUIDBase, SessionUIDCount uint32
	// SessionAllowUserNS lets session processes make user namespaces.
	SessionAllowUserNS bool
	// SessionAllowIOURing lets session processes use io_uring (refused by
	// default: its opcodes reach what the syscall filter refuses, such as
	// sockets of any family); the boundary report then says so.
	SessionAllowIOURing bool
	// SessionTmpfsBytes is the size of each session's /tmp and /dev/shm,
	// SessionMaxProcs its RLIMIT_NPROC; 0: the backend's defaults.
	SessionTmpfsBytes uint64
	SessionMaxProcs   uint32
	// SessionMaxDNSEntries caps each session's DNS-derived entries (rules
	// with an expiry, from AllowEgress): past it AllowEgress returns
	// ErrEntryCap. 0: the backend's default (Linux: 4096).
	SessionMaxDNSEntries uint32
	// SessionMaxSockets caps the inet sockets each session has open, and
	// SessionMaxPorts the local ports its sockets hold (bound, listening or
	// sending unconnected): past them socket(), bind(), listen's autobind
	// or the send fails (EPERM) and the kernel counts a socket_limit or
	// port_limit denial. 0: the backend's defaults (Linux: 4096 and 1024).
	SessionMaxSockets, SessionMaxPorts uint32
	// SessionDenialEventRate and SessionDenialEventBurst are each session's
	// budget of denial events sent to the agent (a second, and at once;
	// Linux: once for its own attempts, once for refusals others cause);
	// the denials past it are still counted (Counters), the events not
	// sent counted apart. 0: the backend's defaults (Linux: 100 and 500).
	SessionDenialEventRate, SessionDenialEventBurst uint32
	// AcceptWeaker names session-boundary mechanisms (Report.Boundary
	// classes) whose weaker level on this host the operator accepts; any
	// other mechanism the host lacks makes session creation fail.
	AcceptWeaker []string
	// FileNeverExtra are credential locations besides the backend's own
	// list (root's home, shadow files, runtime sockets, the homes'
	// credential directories): no file grant opens them (the agent's
	// state and policy directories, its socket's directory). These are the
	// agent's own and no admin policy lifts them (FileEntry.Override lifts
	// only the backend's own list): a session that reached the agent's
	// socket or state would hold every session's authority.
	FileNeverExtra []string
	// PersistDir holds the sessions' persistent paths (persistence);
	// empty: persistence is not offered.
	PersistDir string
}

// PersistentPaths is an optional role: a backend that keeps a session
// name's persistent paths (persistence with survives_session) removes
// them on request; refused while a session of the name exists.
type PersistentPaths interface {
	ForgetPersisted(name string) error
}
