package backend

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// The process section of a Delta (the process class): the programs a
// session may execute and the number of processes it may have.
//
// A session that has never held a process entry is not gated: any program
// in its view runs (as before the class existed) and its processes are
// bounded by the host's bound (Config.SessionMaxProcs). Its first process
// entry gates it for the rest of its life: from then on a program runs
// only if it is the Exec of an entry of a live handle (deny by default:
// when every process grant is revoked, nothing more runs), and its
// process bound is ProcessBound's.

// ErrInvalidProcessEntry is wrapped by every ProcessEntry shape error.
var ErrInvalidProcessEntry = errors.New("backend: invalid process entry")

// ProcessEntry is one entry of the process section, held by Handle: either
// Exec, the absolute path of a program the session may execute (a backend
// resolves it to the file it names, symlinks followed, when it applies the
// entry), or MaxProcesses, the number of processes (threads count, as
// RLIMIT_NPROC counts them) the session may have while the handle lives.
type ProcessEntry struct {
	Exec         string    `json:"exec,omitempty"`
	MaxProcesses uint32    `json:"max_processes,omitempty"`
	Handle       HandleRef `json:"handle"`
}

func (e ProcessEntry) String() string {
	if e.Exec != "" {
		return fmt.Sprintf("exec %s (handle %s)", e.Exec, e.Handle)
	}
	return fmt.Sprintf("max_processes %d (handle %s)", e.MaxProcesses, e.Handle)
}

// Validate checks the shape: exactly one of an absolute clean path of at
// most MaxFilePath bytes and a positive MaxProcesses, and a handle.
func (e ProcessEntry) Validate() error {
	switch {
	case (e.Exec == "") == (e.MaxProcesses == 0):
		return fmt.Errorf("%w: %s: exactly one of exec and max_processes", ErrInvalidProcessEntry, e)
	case e.Exec != "" && (!filepath.IsAbs(e.Exec) || filepath.Clean(e.Exec) != e.Exec || len(e.Exec) > MaxFilePath || strings.ContainsRune(e.Exec, 0)):
		return fmt.Errorf("%w: exec %q: absolute, clean, at most %d bytes", ErrInvalidProcessEntry, e.Exec, MaxFilePath)
	case e.Handle.IsZero():
		return fmt.Errorf("%w: %s: no handle", ErrInvalidProcessEntry, e)
	}
	return nil
}

// ProcessBound is the process bound of a gated session whose live entries
// are live, on a host whose bound is host: per grant (handle), its
// MaxProcesses capped at host, or host when it names no bound; the largest
// of those; 0 (no new process) when no entry is live.
func ProcessBound(live []ProcessEntry, host uint32) uint32 {
	per := map[HandleRef]uint32{}
	for _, e := range live {
		if _, ok := per[e.Handle]; !ok {
			per[e.Handle] = host
		}
		if e.MaxProcesses != 0 {
			per[e.Handle] = min(e.MaxProcesses, host)
		}
	}
	var n uint32
	for _, m := range per {
		n = max(n, m)
	}
	return n
}

// ExecAllowed reports whether the live entries let the session execute the
// program at path (an exact, already resolved path).
func ExecAllowed(live []ProcessEntry, path string) bool {
	return slices.ContainsFunc(live, func(e ProcessEntry) bool { return e.Exec != "" && e.Exec == path })
}

// processEntriesValid checks each entry and that none is named twice.
func processEntriesValid(es []ProcessEntry) error {
	for i, e := range es {
		if err := e.Validate(); err != nil {
			return err
		}
		if slices.Contains(es[:i], e) {
			return fmt.Errorf("%w: %s: the delta names this entry twice", ErrInvalidProcessEntry, e)
		}
	}
	return nil
}

// missingProcess names the first entry of want that have lacks ("" if
// none).
func missingProcess(want, have []ProcessEntry) string {
	for _, e := range want {
		if !slices.Contains(have, e) {
			return "process " + e.String()
		}
	}
	return ""
}
