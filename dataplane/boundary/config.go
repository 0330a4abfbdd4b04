package boundary

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
)

// Default identity range: above systemd's dynamic users (61184-65519) and
// its container range (524288-1878982655), below the 0x7FFE0000 "foreign"
// range systemd reserves. 1<<20 uids: more than the dataplane's default
// MaxSessions (65536) and the 100,000 live sessions the product targets.
const (
	DefaultUIDBase  = 0x70000000 // 1879048192
	DefaultUIDCount = 1 << 20
	// DefaultCatatonit is the pid-1 reaper each session's PID namespace
	// runs (Debian package catatonit).
	DefaultCatatonit = "/usr/bin/catatonit"
	// LauncherName is the dedicated launcher's file name, looked for next
	// to the running executable.
	LauncherName = "shinken-launch"
	// ExecName is the C launcher's file name (cmd/shinken-exec, built by
	// make with clang), looked for next to the dedicated launcher.
	ExecName = "shinken-exec"
	// DefaultTmpfsBytes is the size of each of a session's private tmpfs
	// mounts (/tmp and /dev/shm) when Config.TmpfsBytes is 0.
	DefaultTmpfsBytes = 256 << 20
	// DefaultMaxProcs is a session's RLIMIT_NPROC when Config.MaxProcs is 0.
	DefaultMaxProcs = 4096
	// Bounds of TmpfsBytes and MaxProcs.
	minTmpfsBytes = 1 << 20
	maxTmpfsBytes = 1 << 40
	minMaxProcs   = 8
	maxMaxProcs   = 1 << 22 // the kernel's PID_MAX_LIMIT
)

// Mechanism names: one per row of the boundary report, and the names an
// operator lists in Config.Accept to accept a weaker level.
const (
	MechUIDRange   = "uid range"
	MechSeccomp    = "seccomp"
	MechUserNS     = "user namespaces"
	MechPIDNS      = "pid namespace"
	MechMountNS    = "mount namespace"
	MechCatatonit  = "session init (catatonit)"
	MechLandlock   = "landlock scoping"
	MechLandlockFS = "landlock credential deny"
	MechCaps       = "capabilities and no_new_privs"
	MechIOURing    = "io_uring"
	MechTmpfsSize  = "session tmpfs size"
	MechNProc      = "session process limit"
)

// Config is the session boundary's configuration. The zero value is the
// product's defaults.
type Config struct {
	// UIDBase and UIDCount reserve the uids (and equal gids) of sessions:
	// the session with kernel index i runs as UIDBase+i. Index 0 is never
	// a session, so UIDBase itself is never used.
	UIDBase  uint32
	UIDCount uint32
	// AllowUserNS lets session processes create user namespaces (refused
	// by the seccomp filter otherwise).
	AllowUserNS bool
	// AllowIOURing lets session processes use io_uring (io_uring_setup,
	// io_uring_enter and io_uring_register return ENOSYS otherwise). Its
	// operations are not system calls the seccomp filter sees: with it a
	// session can make sockets of the families the filter refuses
	// (IORING_OP_SOCKET), and the report's io_uring row says so.
	AllowIOURing bool
	// Accept names mechanisms (the Mech* constants) whose weaker level on
	// this host the operator accepts; any other mechanism that cannot be
	// applied makes session creation fail with the reason.
	Accept []string
	// Catatonit is the path of the catatonit binary (default
	// /usr/bin/catatonit).
	Catatonit string
	// Launcher is the path of the dedicated launcher binary
	// (cmd/shinken-launch), re-executed for every session process and
	// every session's init (default: shinken-launch next to the running
	// executable). If it is missing or unsafe (not a root-owned regular
	// file that only root can write), the boundary re-executes the running
	// binary instead, which is slower (its package initialisers run at
	// every launch), and the report says why.
	Launcher string
	// Exec is the path of the C launcher (cmd/shinken-exec), executed for
	// every session process instead of the launcher's launch mode (default:
	// shinken-exec next to the dedicated launcher, or next to the running
	// executable). It has the same safety requirements; if it is missing
	// or unsafe, launches go through the Go launcher's launch mode (about
	// 1 ms slower each), and the report says why.
	Exec string
	// TmpfsBytes is the size of each of a session's private tmpfs mounts,
	// /tmp and /dev/shm (tmpfs size=, rounded up to whole pages by the
	// kernel): writing past it fails with ENOSPC. Both count against the
	// host's memory (and the session cgroup's memory.max where set), so
	// a session can hold at most twice this in them. 0: DefaultTmpfsBytes
	// (256 MiB); otherwise between 1 MiB and 1 TiB.
	TmpfsBytes uint64
	// MaxProcs is RLIMIT_NPROC of every session process, set by the
	// launcher before it drops to the session's uid: the kernel counts
	// the processes and threads of that uid across the host, and each
	// session has a uid of its own, so it bounds the session's processes
	// (a fork past it fails with EAGAIN) whatever the cgroup setup. Root
	// is exempt; session processes never run as root (a privileged launch
	// is not bounded). 0: DefaultMaxProcs (4096); otherwise between 8 and
	// 4194304.
	MaxProcs uint32
	// FileNever are the credential locations no session's view opens,
	// whatever a file grant says: masked wherever a grant or a workspace
	// would show them. Nil: DefaultFileNever().
	FileNever []string
	// FileNeverFixed are those of FileNever that no admin override
	// (backend.FileEntry.Override) lifts: the agent's own state and policy
	// directories and socket (a session that reached them would hold
	// every session's authority).
	FileNeverFixed []string
	// PersistDir holds the sessions' persistent paths (persistence
	// grants): keep/NAME for those that survive the session, kept until
	// ForgetPersisted, and session/NAME for the others, removed with the
	// session. Empty: persistence is not offered.
	PersistDir string
	// PersistBind makes every persistent path a bind of the session
	// name's directory alone (the host's content at the path hidden),
	// even where an overlay could be made: the fallback, chosen.
	PersistBind bool
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.UIDBase == 0 && c.UIDCount == 0 {
		c.UIDBase, c.UIDCount = DefaultUIDBase, DefaultUIDCount
	}
	if c.UIDCount == 0 {
		c.UIDCount = DefaultUIDCount
	}
	if c.Catatonit == "" {
		c.Catatonit = DefaultCatatonit
	}
	if c.TmpfsBytes == 0 {
		c.TmpfsBytes = DefaultTmpfsBytes
	}
	if c.MaxProcs == 0 {
		c.MaxProcs = DefaultMaxProcs
	}
	if c.FileNever == nil {
		c.FileNever = DefaultFileNever()
	}
}

// overlayInternalID is the on-disk uid and gid of the persistence
// overlays' own objects (overlay_linux.go; shown as root to the overlay).
// Outside every session uid range (Validate) and the systemd ranges.
const overlayInternalID = 3_000_000_000

// ErrUIDRange is wrapped by every identity range error.
var ErrUIDRange = errors.New("boundary: session uid range")

// ErrIdentity is wrapped by Launch's refusal of a uid or gid that is not
// the session's own: a process started as another session's uid would hold
// that session's files and signals, one with a host group (shadow, disk,
// docker) that group's files and sockets.
var ErrIdentity = errors.New("boundary: a session's processes run as its own uid and gid only")

// Validate checks the range against the largest session index the
// dataplane can hand out (indices are 1..maxSessions-1): it must hold every
// index and never contain 0 (root), 65534 (nobody) or 2^32-1 (the invalid
// uid -1).
func (c Config) Validate(maxSessions uint32) error {
	if c.UIDCount < maxSessions {
		return fmt.Errorf("%w: %d uids for up to %d sessions", ErrUIDRange, c.UIDCount, maxSessions)
	}
	last := uint64(c.UIDBase) + uint64(c.UIDCount) - 1
	if last >= 1<<32-1 {
		return fmt.Errorf("%w: %d+%d runs past uid 4294967294", ErrUIDRange, c.UIDBase, c.UIDCount)
	}
	for _, bad := range []uint64{0, 65534} {
		if uint64(c.UIDBase) <= bad && bad <= last {
			return fmt.Errorf("%w: [%d, %d] contains uid %d", ErrUIDRange, c.UIDBase, last, bad)
		}
	}
	if c.TmpfsBytes != 0 && (c.TmpfsBytes < minTmpfsBytes || c.TmpfsBytes > maxTmpfsBytes) {
		return fmt.Errorf("boundary: tmpfs size %d bytes outside [%d, %d]", c.TmpfsBytes, uint64(minTmpfsBytes), uint64(maxTmpfsBytes))
	}
	if c.MaxProcs != 0 && (c.MaxProcs < minMaxProcs || c.MaxProcs > maxMaxProcs) {
		return fmt.Errorf("boundary: max processes %d outside [%d, %d]", c.MaxProcs, minMaxProcs, maxMaxProcs)
	}
	if uint64(c.UIDBase) <= overlayInternalID && overlayInternalID <= last {
		return fmt.Errorf("%w: [%d, %d] contains %d, the persistence overlays' internal id", ErrUIDRange, c.UIDBase, last, uint64(overlayInternalID))
	}
	if c.PersistDir != "" && (!filepath.IsAbs(c.PersistDir) || filepath.Clean(c.PersistDir) != c.PersistDir) {
		return fmt.Errorf("boundary: persist directory %q is not an absolute clean path", c.PersistDir)
	}
	for _, p := range c.FileNever {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("boundary: file never-list: %q is not an absolute clean path other than /", p)
		}
	}
	for _, p := range c.FileNeverFixed {
		if !slices.Contains(c.FileNever, p) {
			return fmt.Errorf("boundary: fixed file never-list: %q is not in the file never-list", p)
		}
	}
	for _, m := range c.Accept {
		if !knownMech(m) {
			return fmt.Errorf("boundary: accept: unknown mechanism %q", m)
		}
	}
	return nil
}

// UID is the uid (and gid) of the session with kernel index index. It is a
// pure function of the index, which the dataplane persists in pinned maps
// and restores at adoption, so a session keeps its uid across agent
// restarts; an index, and so its uid, is handed out again only after the
// session was destroyed (its cgroup killed: nothing of it still runs).
func (c Config) UID(index uint32) (uint32, error) {
	if index == 0 || index >= c.UIDCount {
		return 0, fmt.Errorf("%w: session index %d outside [1, %d)", ErrUIDRange, index, c.UIDCount)
	}
	return c.UIDBase + index, nil
}

func (c Config) accepts(mech string) bool {
	for _, m := range c.Accept {
		if m == mech {
			return true
		}
	}
	return false
}

func knownMech(m string) bool {
	switch m {
	case MechUIDRange, MechSeccomp, MechUserNS, MechPIDNS, MechMountNS, MechCatatonit, MechLandlock, MechLandlockFS, MechCaps, MechIOURing, MechTmpfsSize, MechNProc:
		return true
	}
	return false
}
