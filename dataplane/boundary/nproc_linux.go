package boundary

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
)

// A session's process bound (the process class's max_processes, the host's
// bound otherwise): RLIMIT_NPROC of its uid on its running processes and
// launches, and pids.max where the pids controller is on cgroup v2.

// setPidsMax writes bound to the session cgroup's pids.max where it has
// the pids controller on cgroup v2 (the file exists only then; cgroup v1
// is never written).
func setPidsMax(dir string, bound uint32) error {
	f, err := os.OpenFile(dir+"/pids.max", os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pids.max: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(strconv.FormatUint(uint64(bound), 10)); err != nil {
		return fmt.Errorf("pids.max %d: %w", bound, err)
	}
	return nil
}

// setNProc sets RLIMIT_NPROC (soft and hard) of every process of uid in
// the session cgroup dir (and the cgroups below it) to bound, again until a
// pass finds no process it had not set (a fork during a pass inherits the
// old limit). It runs on a thread of ours that took the session's uid: the
// kernel lets a process of the same uid lower the limit without
// CAP_SYS_RESOURCE (which the agent may lack), and no one raise a hard
// limit without it, so a larger bound reaches the next launches only.
func setNProc(dir string, uid, bound uint32) error {
	// The thread's uid is the session's.
	return throwaway.Run(func() error {
		if err := child.SetThreadIDs(uid, uid); err != nil {
			return err
		}
		return setNProcAs(dir, uid, bound)
	})
}

func setNProcAs(dir string, uid, bound uint32) error {
	done := map[int]bool{}
	for pass := 0; pass < 8; pass++ {
		fresh := 0
		var errs []error
		walkProcs(dir, func(pid int) {
			if done[pid] {
				return
			}
			fresh++
			done[pid] = true
			var old unix.Rlimit
			if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, nil, &old); err != nil {
				if errors.Is(err, unix.ESRCH) {
					return
				}
				if u, uerr := euidOf(int32(pid)); uerr == nil && u != uid {
					return // the holder, or the agent's launch step: not the session's uid
				}
				errs = append(errs, fmt.Errorf("RLIMIT_NPROC of %d: %w", pid, err))
				return
			}
			n := min(uint64(bound), old.Max)
			if old.Cur == n && old.Max == n {
				return
			}
			if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}, nil); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("RLIMIT_NPROC %d of %d: %w", n, pid, err))
			}
		})
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		if fresh == 0 {
			return nil
		}
	}
	return fmt.Errorf("RLIMIT_NPROC %d: the session kept forking through 8 passes", bound)
}

func walkProcs(dir string, fn func(pid int)) {
	if b, err := os.ReadFile(dir + "/cgroup.procs"); err == nil {
		for _, l := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(l); err == nil {
				fn(pid)
			}
		}
	}
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		if e.IsDir() {
			walkProcs(dir+"/"+e.Name(), fn)
		}
	}
}
