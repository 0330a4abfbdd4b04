//go:build linux

package main

// The worker: this binary, started inside a session through the API
// (POST /v1/sessions/{id}/run), times its own operations so that the
// launch through the agent is not part of a figure, and prints one line
// per operation: "open N1 N2 ...", "git ...", "exec ..." (nanoseconds per
// call), or for the grant-to-visible phase "seen T1 T2 ..." (CLOCK_MONOTONIC
// nanoseconds at which each probe file could first be created).

import (
	"fmt"
	"os"
	"os/exec"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
)

// workerMain runs argv[2:] = MODE ARGS... (argv[1] is "worker"): "ops FILE REPO NOPEN NGIT NEXEC"
// or "visible DIR K".
func workerMain() {
	a := os.Args[2:]
	var err error
	switch {
	case len(a) == 6 && a[0] == "ops":
		err = ops(a[1], a[2], benchkit.WorkerCount(a[3]), benchkit.WorkerCount(a[4]), benchkit.WorkerCount(a[5]))
	case len(a) == 3 && a[0] == "visible":
		err = visible(a[1], benchkit.WorkerCount(a[2]))
	default:
		err = fmt.Errorf("worker: bad arguments %q", a)
	}
	benchkit.WorkerExit(err)
}

// ops times nOpen open+read+close of file, nGit `git status` in repo and
// nExec fork+exec+wait of /bin/true.
func ops(file, repo string, nOpen, nGit, nExec int) error {
	buf := make([]byte, 4096)
	times := make([]int64, 0, nOpen)
	for i := 0; i < nOpen; i++ {
		t0 := benchkit.MonoNS()
		fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", file, err)
		}
		if _, err := unix.Read(fd, buf); err != nil {
			return fmt.Errorf("read %s: %w", file, err)
		}
		unix.Close(fd)
		times = append(times, benchkit.MonoNS()-t0)
	}
	benchkit.Line("open", times)
	times = times[:0]
	for i := 0; i < nGit; i++ {
		cmd := exec.Command("git", "-c", "safe.directory=*", "-c", "core.untrackedCache=false", "-C", repo, "status", "--porcelain")
		t0 := benchkit.MonoNS()
		out, err := cmd.CombinedOutput()
		took := benchkit.MonoNS() - t0
		if err != nil || len(out) != 0 {
			return fmt.Errorf("git status in %s: %v %q (want a clean tree)", repo, err, out)
		}
		times = append(times, took)
	}
	benchkit.Line("git", times)
	times = times[:0]
	for i := 0; i < nExec; i++ {
		t0 := benchkit.MonoNS()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return fmt.Errorf("exec /bin/true: %w", err)
		}
		times = append(times, benchkit.MonoNS()-t0)
	}
	benchkit.Line("exec", times)
	return nil
}

// visible creates dir/probe-0 ... dir/probe-(k-1) in turn: for each i it
// waits for dir/go-i (made by the bench on the host once the previous
// grant is revoked, so the mount is read-only again), then retries
// open(O_CREAT) of probe-i every 50 µs until it succeeds (the bench grants
// write on dir, waits for the probe on the host, revokes), and records
// when it did.
func visible(dir string, k int) error {
	seen := make([]int64, 0, k)
	deadline := time.Now().Add(5 * time.Minute)
	wait := func(what string, ok func() (bool, error)) error {
		for {
			done, err := ok()
			if done || err != nil {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: waited 5 minutes", what)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	for i := 0; i < k; i++ {
		g := fmt.Sprintf("%s/go-%d", dir, i)
		if err := wait(g, func() (bool, error) { return unix.Access(g, unix.F_OK) == nil, nil }); err != nil {
			return err
		}
		p := fmt.Sprintf("%s/probe-%d", dir, i)
		err := wait(p, func() (bool, error) {
			fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err == nil {
				seen = append(seen, benchkit.MonoNS())
				unix.Close(fd)
				return true, nil
			}
			if err != unix.EROFS && err != unix.EACCES && err != unix.EPERM {
				return false, fmt.Errorf("open %s: %w", p, err)
			}
			return false, nil
		})
		if err != nil {
			return err
		}
	}
	benchkit.Line("seen", seen)
	return nil
}
