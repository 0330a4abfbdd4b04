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
	// FS is the Landlock filesystem access rights the launcher's domain
	// handles (LANDLOCK_ACCESS_FS_*; 0: none, only the scopes of
	// Landlock). FSRules are the paths beneath which all of them are
	// allowed (a path that is not a directory: the file rights among
	// them); everything else, the credential locations among it, is
	// denied them (landlock_linux.go in package boundary). v3 only.
	FS      uint64
	FSRules []string
	// Ruleset is the fd of a Landlock ruleset the agent built for the
	// session (FS and the scopes handled, every rule added: the session's
	// baseline, cached per session): the launcher enters it with
	// landlock_restrict_self instead of building one from FSRules, and
	// closes it first (close-on-exec from the start, closed once
	// entered). 0: none (fds 0-2 are never a ruleset). v4 only; FSRules
	// are then empty.
	Ruleset int
}

// keepBelow is the lowest of the launcher's own descriptors (Status, ExeFD,
// Ruleset: the agent puts them after everything the target is to get). The
// target keeps the descriptors below it, 0, 1, 2 and what the agent passed
// on purpose; every one from it up is closed at exec, in either launcher.
func (l Launch) keepBelow() int {
	keep := l.Status
	if l.ExeFD >= 0 && l.ExeFD < keep {
		keep = l.ExeFD
	}
	if l.Ruleset > 0 && l.Ruleset < keep {
		keep = l.Ruleset
	}
	return keep
}

// StartEnv is added to the launcher's environment: with GOMAXPROCS set,
// the Go runtime skips reading the cgroup CPU limits at start-up (a
// quarter of the launcher's start-up time here).
const StartEnv = "GOMAXPROCS=1"

// MaxNProc bounds Launch.NProc (the kernel's PID_MAX_LIMIT).
const MaxNProc = 1 << 22

// MaxFS bounds Launch.FS (the Landlock filesystem rights of ABI 1 to 9).
const MaxFS = 1<<17 - 1

// Args is the launcher's argv: its spec, the seccomp filter, the Landlock
// rules, the target's path, then the target's argv. The spec is
// "v3,UID,GID,PRIVILEGED,STATUS,EXEFD,LANDLOCK,DROPENV,NPROC,FS" and the
// rules FSRules joined by newlines (a path holding a newline is left out:
// it gets no rule, so less access, never more). The launchers also read
// v2 (no FS, no rules argument) and v1 (the same less NPROC).
//
// With Ruleset the spec is "v4,...,FS,RULESET" (v3's fields, then the
// ruleset's fd) and the rules argument is empty.
func (l Launch) Args(argv []string) []string {
	f := fmt.Sprintf("v3,%d,%d,%d,%d,%d,%d,%d,%d,%d", l.UID, l.GID, b2i(l.Privileged), l.Status, l.ExeFD, l.Landlock, b2i(l.DropEnv), l.NProc, l.FS)
	if l.Ruleset > 0 {
		f = "v4" + f[2:] + fmt.Sprintf(",%d", l.Ruleset)
		return append([]string{LaunchArg0, f, hex.EncodeToString(l.Filter), "", l.Path}, argv...)
	}
	rules := make([]string, 0, len(l.FSRules))
	for _, r := range l.FSRules {
		if r != "" && !strings.Contains(r, "\n") {
			rules = append(rules, r)
		}
	}
	return append([]string{LaunchArg0, f, hex.EncodeToString(l.Filter), strings.Join(rules, "\n"), l.Path}, argv...)
}

// ParseLaunch reads what Args wrote (v4 or v3), or a v2 or v1 spec; it
// returns the target's argv.
func ParseLaunch(args []string) (Launch, []string, error) {
	var l Launch
	if len(args) < 4 || args[0] != LaunchArg0 {
		return l, nil, errors.New("not a launch")
	}
	ruleset := int64(0)
	n, err := fields(args[1], "v4", 10)
	if err == nil {
		ruleset, n = n[9], n[:9]
		if ruleset < 3 || ruleset > 1<<20 || n[8] == 0 || len(args) < 5 || args[3] != "" {
			return l, nil, errors.New("bad launch spec: a ruleset needs rights, a descriptor past stdio and no rules")
		}
	} else {
		n, err = fields(args[1], "v3", 9)
	}
	rest := 4
	if err == nil {
		if len(args) < 5 {
			return l, nil, errors.New("bad launch spec")
		}
		rest = 5
		if args[3] != "" {
			l.FSRules = strings.Split(args[3], "\n")
		}
	} else if n, err = fields(args[1], "v2", 8); err == nil {
		n = append(n, 0)
	} else {
		if n, err = fields(args[1], "v1", 7); err != nil {
			return l, nil, err
		}
		n = append(n, 0, 0)
	}
	if n[0] < 0 || n[1] < 0 || n[5] < 0 || n[0] > 1<<32-1 || n[1] > 1<<32-1 || n[3] < 3 || n[3] > 1<<20 || n[4] > 1<<20 || n[7] < 0 || n[7] > MaxNProc || n[8] < 0 || n[8] > MaxFS {
		return l, nil, errors.New("bad launch spec")
	}
	if n[8] == 0 && l.FSRules != nil {
		return l, nil, errors.New("bad launch spec: Landlock rules without rights")
	}
	l = Launch{UID: uint32(n[0]), GID: uint32(n[1]), Privileged: n[2] == 1, Status: int(n[3]), ExeFD: int(n[4]), Landlock: uint64(n[5]), DropEnv: n[6] == 1, Path: args[rest-1], NProc: uint64(n[7]), FS: uint64(n[8]), FSRules: l.FSRules, Ruleset: int(ruleset)}
	if l.Filter, err = hex.DecodeString(args[2]); err != nil || len(l.Filter)%8 != 0 {
		return l, nil, errors.New("bad seccomp filter")
	}
	if len(l.Filter) == 0 {
		l.Filter = nil
	}
	return l, args[rest:], nil
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
