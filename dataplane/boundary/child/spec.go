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
}

// StartEnv is added to the launcher's environment: with GOMAXPROCS set,
// the Go runtime skips reading the cgroup CPU limits at start-up (a
// quarter of the launcher's start-up time here).
const StartEnv = "GOMAXPROCS=1"

// Args is the launcher's argv: its spec, then the target's argv.
func (l Launch) Args(argv []string) []string {
	f := fmt.Sprintf("v1,%d,%d,%d,%d,%d,%d,%d", l.UID, l.GID, b2i(l.Privileged), l.Status, l.ExeFD, l.Landlock, b2i(l.DropEnv))
	return append([]string{LaunchArg0, f, hex.EncodeToString(l.Filter), l.Path}, argv...)
}

// ParseLaunch reads what Args wrote; it returns the target's argv.
func ParseLaunch(args []string) (Launch, []string, error) {
	var l Launch
	if len(args) < 4 || args[0] != LaunchArg0 {
		return l, nil, errors.New("not a launch")
	}
	n, err := fields(args[1], 7)
	if err != nil {
		return l, nil, err
	}
	if n[0] < 0 || n[1] < 0 || n[5] < 0 || n[0] > 1<<32-1 || n[1] > 1<<32-1 || n[3] < 3 || n[3] > 1<<20 || n[4] > 1<<20 {
		return l, nil, errors.New("bad launch spec")
	}
	l = Launch{UID: uint32(n[0]), GID: uint32(n[1]), Privileged: n[2] == 1, Status: int(n[3]), ExeFD: int(n[4]), Landlock: uint64(n[5]), DropEnv: n[6] == 1, Path: args[3]}
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
}

// Args is the session init's argv.
func (i Init) Args() []string {
	return []string{InitArg0, fmt.Sprintf("v1,%d,%d", i.Status, b2i(i.NoMounts)), i.Catatonit}
}

// ParseInit reads what Init.Args wrote.
func ParseInit(args []string) (Init, error) {
	if len(args) != 3 || args[0] != InitArg0 {
		return Init{}, errors.New("not a session init")
	}
	n, err := fields(args[1], 2)
	if err != nil || n[0] < 3 || n[0] > 1<<20 {
		return Init{}, errors.New("bad init spec")
	}
	return Init{Status: int(n[0]), NoMounts: n[1] == 1, Catatonit: args[2]}, nil
}

// fields parses "v1,a,b,...": exactly n signed integers after the version.
func fields(s string, n int) ([]int64, error) {
	parts := strings.Split(s, ",")
	if len(parts) != n+1 || parts[0] != "v1" {
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
