// Package child is the code of the session boundary that runs in a
// re-executed process: the session init (mounts, then catatonit as the
// session's pid 1) and the launcher (privileges dropped, Landlock, seccomp,
// then the target). It is kept small on purpose: the dedicated launcher
// binary (cmd/shinken-launch) links this package and nothing else of the
// agent, so its start-up runs few package initialisers. The agent side
// (package boundary) prepares everything that can be prepared in advance,
// the seccomp filter included, and passes it on the command line.
package child

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// argv[0] of the re-executed modes. Main recognises them only together
// with a well-formed spec in argv[1] and the status pipe at the fd it names.
const (
	LaunchArg0 = "shinken-session-launch"
	InitArg0   = "shinken-session-init"
)

// Launch is what the agent tells the launch-mode child.
type Launch struct {
	UID, GID   uint32
	Privileged bool
	Status     int    // fd of the status pipe (write end)
	ExeFD      int    // fd of the launcher binary, closed before exec; -1 if none
	Landlock   uint64 // Landlock scopes to apply (LANDLOCK_SCOPE_*); 0: none
	Filter     []byte // the seccomp filter (struct sock_filter array); nil: none
	Path       string // the target, resolved inside the session
	// DropEnv: the last entry of the environment is StartEnv, added by the
	// agent for the launcher alone; the target does not get it.
	DropEnv bool
	// NProc is RLIMIT_NPROC (soft and hard), set before the launcher
	// drops to UID; 0: left as inherited (the v1 spec has no such field).
	NProc uint64
}

// StartEnv is added to the launcher's environment: with GOMAXPROCS set,
// the Go runtime skips reading the cgroup CPU limits at start-up (a
// quarter of the launcher's start-up time here).
const StartEnv = "GOMAXPROCS=1"

// MaxNProc bounds Launch.NProc (the kernel's PID_MAX_LIMIT).
const MaxNProc = 1 << 22

// Args is the launcher's argv: its spec, then the target's argv. The spec
// is "v2,UID,GID,PRIVILEGED,STATUS,EXEFD,LANDLOCK,DROPENV,NPROC"; the
// launchers also read v1, the same less NPROC.
func (l Launch) Args(argv []string) []string {
	f := fmt.Sprintf("v2,%d,%d,%d,%d,%d,%d,%d,%d", l.UID, l.GID, b2i(l.Privileged), l.Status, l.ExeFD, l.Landlock, b2i(l.DropEnv), l.NProc)
	return append([]string{LaunchArg0, f, hex.EncodeToString(l.Filter), l.Path}, argv...)
}

// ParseLaunch reads what Args wrote (v2), or a v1 spec; it returns the
// target's argv.
func ParseLaunch(args []string) (Launch, []string, error) {
	var l Launch
	if len(args) < 4 || args[0] != LaunchArg0 {
		return l, nil, errors.New("not a launch")
	}
	n, err := fields(args[1], "v2", 8)
	if err != nil {
		if n, err = fields(args[1], "v1", 7); err != nil {
			return l, nil, err
		}
		n = append(n, 0)
	}
	if n[0] < 0 || n[1] < 0 || n[5] < 0 || n[0] > 1<<32-1 || n[1] > 1<<32-1 || n[3] < 3 || n[3] > 1<<20 || n[4] > 1<<20 || n[7] < 0 || n[7] > MaxNProc {
		return l, nil, errors.New("bad launch spec")
	}
	l = Launch{UID: uint32(n[0]), GID: uint32(n[1]), Privileged: n[2] == 1, Status: int(n[3]), ExeFD: int(n[4]), Landlock: uint64(n[5]), DropEnv: n[6] == 1, Path: args[3], NProc: uint64(n[7])}
	if l.Filter, err = hex.DecodeString(args[2]); err != nil || len(l.Filter)%8 != 0 {
		return l, nil, errors.New("bad seccomp filter")
	}
	if len(l.Filter) == 0 {
		l.Filter = nil
	}
	return l, args[4:], nil
}

// Init is what the agent tells the session-init child.
type Init struct {
	Status    int
	NoMounts  bool
	Catatonit string
	// TmpfsBytes is the size of the session's /tmp and /dev/shm (0: the
	// kernel's default, half the host's memory; the v1 spec has none).
	TmpfsBytes uint64
}

// Args is the session init's argv: "v2,STATUS,NOMOUNTS,TMPFSBYTES"
// (ParseInit also reads v1, the same less TMPFSBYTES).
func (i Init) Args() []string {
	return []string{InitArg0, fmt.Sprintf("v2,%d,%d,%d", i.Status, b2i(i.NoMounts), i.TmpfsBytes), i.Catatonit}
}

// ParseInit reads what Init.Args wrote, or a v1 spec.
func ParseInit(args []string) (Init, error) {
	if len(args) != 3 || args[0] != InitArg0 {
		return Init{}, errors.New("not a session init")
	}
	n, err := fields(args[1], "v2", 3)
	if err != nil {
		n, err = fields(args[1], "v1", 2)
		n = append(n, 0)
	}
	if err != nil || n[0] < 3 || n[0] > 1<<20 || n[2] < 0 {
		return Init{}, errors.New("bad init spec")
	}
	return Init{Status: int(n[0]), NoMounts: n[1] == 1, Catatonit: args[2], TmpfsBytes: uint64(n[2])}, nil
}

// fields parses "VERSION,a,b,...": exactly n signed integers after the
// version.
func fields(s, version string, n int) ([]int64, error) {
	parts := strings.Split(s, ",")
	if len(parts) != n+1 || parts[0] != version {
		return nil, errors.New("bad spec")
	}
	out := make([]int64, n)
	for i, p := range parts[1:] {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, errors.New("bad spec")
		}
		out[i] = v
	}
	return out, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
