package backend

import (
	"os/exec"
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

// Enforceable reports whether the level enforces anything.
func (l Level) Enforceable() bool { return l != Unavailable && l != "" }

// Strength says how one capability class (or one mechanism of the session
// boundary) is enforced on this host, as probed when the backend opened.
type Strength struct {
	Class     string `json:"class"`
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
func (r Report) Class(c string) Strength {
	for _, s := range r.Classes {
		if s.Class == c {
			return s
		}
	}
	return Strength{Class: c, Level: Unavailable, Mechanism: "none", Reason: "the " + r.Backend + " backend has no mechanism for this class"}
}

// Delta is the OS change of one grant in one session: what to add and what
// to remove. A backend applies it all or not at all.
type Delta struct {
	AddEgress    []EgressRule
	RemoveEgress []EgressRule
}

// LaunchOptions says who a session process runs as.
type LaunchOptions struct {
	// UID and GID of the process; both zero means the session's own
	// identity. UID 0 is refused unless Privileged.
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
}

// Backend is one operating system's enforcement: the only way the control
// plane touches the OS. Implementations are safe for concurrent use.
type Backend interface {
	// Probe returns what the backend found on this host when it opened.
	Probe() Report

	// Sessions. A session is the unit of authority: created empty (it can
	// do nothing that needs a grant), ended with everything in it killed.
	CreateSession(name string) (Session, error)
	DestroySession(name string) error
	Session(name string) (Session, error)
	SessionByIndex(index uint32) (Session, error)
	Sessions() ([]Session, error)
	// CheckLimits says whether every quota in l can be enforced here,
	// changing nothing; SetLimits applies them to a session.
	CheckLimits(l Limits) error
	SetLimits(session string, l Limits) error
	// Launch starts cmd inside the session: the one path by which a
	// process enters a session.
	Launch(session string, cmd *exec.Cmd, opts LaunchOptions) error

	// Grants. NewHandle issues a live caretaker handle (a child of parent
	// when parent is not zero). Apply pushes a grant's OS delta, all or
	// nothing. Revoke kills a handle and its whole subtree with one write
	// and cuts the flows that no live grant covers any more, at most one
	// sweep, before it returns; revoking a dead handle is a no-op. Release
	// reclaims what a dead grant held (its rules, then its slot), with no
	// further revoke write or sweep.
	NewHandle(parent HandleRef, expires time.Time) (HandleRef, error)
	// NewOnceHandle issues an approve-once handle (HandleOnce): the first
	// allowed use in the kernel consumes it atomically; a backend that
	// cannot consume at use time refuses it (ErrNotSupported), never
	// issues a many-use handle instead.
	NewOnceHandle(parent HandleRef, expires time.Time) (HandleRef, error)
	Apply(session string, d Delta) error
	Revoke(ref HandleRef) error
	Release(session string, ref HandleRef, rules []EgressRule) error
	// SetNeverList replaces the never-list (DefaultNeverList is in force
	// from the start): destinations refused before any grant is consulted.
	SetNeverList(entries []NeverEntry) error
	// AllowEgress adds one rule (the DNS resolver's path: answers become
	// rules under the grant's handle, with the record's TTL).
	AllowEgress(session string, r EgressRule) error

	// Snapshot of the kernel's state, for reconcile and status.
	Handles() ([]Handle, error)
	// HandleState reads one handle's state word (an approve-once handle
	// reads HandleUsed once the kernel consumed it); a freed or recycled
	// slot is HandleFree.
	HandleState(ref HandleRef) (HandleState, error)
	EgressRules(session string) ([]EgressRule, error)

	// Telemetry.
	Counters(index uint32) ([NumReasons]uint64, error)
	RingbufDrops() (uint64, error)
	SweepStats() SweepStats
	Occupancy() []Occupancy
	Ops() Ops
	Events() (EventReader, error)

	// DNS: send every session DNS query to the resolver on port (0: off).
	SetDNSRedirect(port uint16) error
	DNSRedirect() (uint16, error)

	// Close stops the backend's goroutines and closes its descriptors;
	// what is pinned keeps enforcing. Uninstall removes everything.
	Close() error
	Uninstall() error
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
	// SessionUIDBase and SessionUIDCount reserve the uids (and gids) of
	// sessions; zero means the backend's default range.
	SessionUIDBase, SessionUIDCount uint32
	// SessionAllowUserNS lets session processes make user namespaces.
	SessionAllowUserNS bool
	// AcceptWeaker names session-boundary mechanisms (Report.Boundary
	// classes) whose weaker level on this host the operator accepts; any
	// other mechanism the host lacks makes session creation fail.
	AcceptWeaker []string
}
