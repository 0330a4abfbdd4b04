// Package prepared is the part of the session boundary that runs in the
// session runtime's shim: it starts a launch that the boundary's Prepare
// made ready in the agent (Start), from the descriptors Prepare opened.
// Everything else of the boundary (the launch's spec and seccomp filter,
// the Landlock rules, the holders, the views) stays in package boundary,
// which the shim does not link: a shim starts for every session process
// (and four spares ahead of need), and the boundary's dependencies
// (go-seccomp-bpf's tables, debug/elf, go-landlock and through it libcap's
// psx, which makes a cgo binary) cost every shim's start CPU and time in
// their initialisation and page faults (bench/README.md, issue 20).
package prepared

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/creack/pty"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
	"golang.org/x/sys/unix"
)

// NSFlags are the namespaces each session owns; the network namespace
// stays the host's so the cgroup hooks see every socket. The cgroup
// namespace is rooted at the session cgroup: its processes see their own
// subtree only.
const NSFlags = unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP

// Arg0 marks a prepared launch's Args.
const Arg0 = "shinken-prepared-v1"

// Launch is the JSON in Args[1]. Files: [launcher binary, run cgroup,
// holder pidfd (with namespaces only), the session's Landlock ruleset
// (with Ruleset only)].
type Launch struct {
	NS       bool     `json:"ns"`
	Dir      string   `json:"dir"`
	Env      []string `json:"env"`
	Launcher []string `json:"launcher"` // the launcher's argv (spec, target argv)
	Ruleset  bool     `json:"ruleset"`  // the last file is the session's Landlock ruleset (child.Launch.Ruleset)
	UID      uint32   `json:"uid"`      // owner of a terminal's slave end
}

// Start starts a launch that the boundary's Prepare made ready, from the
// calling process (which becomes its parent): on a locked thread that
// joins the session holder's namespaces, as the boundary's Launch does.
// With req.TTY, the terminal is opened on that thread from the session's
// own devpts instance (/dev/ptmx of its mount namespace, see
// child.SessionMounts), so the session reaches neither the host's
// terminals nor another session's; the slave end is the process's stdio
// and controlling terminal (a new session). It returns once the launcher
// has executed the target, or with why it could not.
func Start(req backend.StartRequest) (backend.Started, error) {
	if len(req.Args) != 2 || req.Args[0] != Arg0 {
		return backend.Started{}, errors.New("boundary: not a prepared launch")
	}
	var p Launch
	if err := json.Unmarshal([]byte(req.Args[1]), &p); err != nil || len(p.Launcher) == 0 {
		return backend.Started{}, fmt.Errorf("boundary: bad prepared launch: %v", err)
	}
	want := 2
	if p.NS {
		want = 3
	}
	if p.Ruleset {
		want++
	}
	if len(req.Files) != want {
		return backend.Started{}, fmt.Errorf("boundary: prepared launch needs %d descriptors, got %d", want, len(req.Files))
	}
	if req.TTY && !p.NS {
		return backend.Started{}, errors.New("boundary: a terminal needs the session's own devpts, and sessions run without namespaces here")
	}
	exe, cg := req.Files[0], req.Files[1]
	cmd := &exec.Cmd{Path: "/proc/self/fd/4", Args: p.Launcher, Env: p.Env, Dir: p.Dir,
		Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr}
	if p.Ruleset {
		// [ruleset, status pipe, launcher binary] at 3, 4, 5 (Prepare).
		cmd.ExtraFiles, cmd.Path = []*os.File{req.Files[want-1]}, "/proc/self/fd/5"
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	var master *os.File
	start := func() error {
		if req.TTY {
			m, s, err := pty.Open()
			if err != nil {
				return fmt.Errorf("open the session's terminal: %w", err)
			}
			defer s.Close()
			if err := unix.Fchown(int(s.Fd()), int(p.UID), int(p.UID)); err != nil {
				m.Close()
				return fmt.Errorf("terminal owner: %w", err)
			}
			if err := pty.Setsize(m, &pty.Winsize{Rows: req.Rows, Cols: req.Cols}); err != nil {
				m.Close()
				return fmt.Errorf("terminal size: %w", err)
			}
			cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
			cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
			master = m
		}
		err := StartReporting(cmd, exe)
		if err != nil && master != nil {
			master.Close()
			master = nil
		}
		return err
	}
	var err error
	if !p.NS {
		err = start()
	} else {
		err = throwaway.Run(func() error {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("unshare(CLONE_FS): %w", err)
			}
			if err := unix.Setns(int(req.Files[2].Fd()), NSFlags); err != nil {
				return fmt.Errorf("join session namespaces (setns pidfd): %w", err)
			}
			return start()
		})
	}
	if err != nil {
		return backend.Started{}, fmt.Errorf("boundary: start prepared launch: %w", ExecFault(err))
	}
	return backend.Started{Process: cmd.Process, PTY: master}, nil
}

// ExecFault marks err, a launch's failure, as the program's when the
// launcher reported it from its last step, the execve of the target
// ("exec PATH" with its errno; either launcher), and the errno says the
// program is at fault: backend.ErrExecDenied for EACCES and EPERM,
// backend.ErrExecFailed for a path or file that is no program. Anything
// else stays the host's: the launcher's own start, a confinement step,
// and an execve that failed for the host's or the session's state
// (EAGAIN at the session's process bound, ENOMEM, EIO, ETXTBSY).
func ExecFault(err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) || !strings.HasPrefix(err.Error(), "exec ") {
		return err
	}
	switch errno {
	case unix.EACCES, unix.EPERM:
		return markedError{err, backend.ErrExecDenied}
	case unix.ENOENT, unix.ENOTDIR, unix.ELOOP, unix.ENAMETOOLONG, unix.ENOEXEC, unix.E2BIG, unix.ELIBBAD:
		return markedError{err, backend.ErrExecFailed}
	}
	return err
}

// markedError is err, also matching mark (errors.Is), with err's message.
type markedError struct{ err, mark error }

func (e markedError) Error() string   { return e.err.Error() }
func (e markedError) Unwrap() []error { return []error{e.err, e.mark} }

// StartReporting starts cmd (a launcher, or the agent's binary in a
// session mode: its status pipe at fd 3+len(ExtraFiles), the binary at
// the next fd) and waits until it has executed its final program (the
// pipe closes on exec) or reported why it could not. On failure the child
// is reaped.
func StartReporting(cmd *exec.Cmd, exe *os.File) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	extra := cmd.ExtraFiles
	cmd.ExtraFiles = append(append([]*os.File(nil), extra...), w, exe)
	err = cmd.Start()
	cmd.ExtraFiles = extra
	w.Close()
	if err != nil {
		return err
	}
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	if len(msg) > 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return StatusError(string(msg))
	}
	return nil
}

// StatusError is the error a launcher reported on its status pipe: text
// (the Go launcher), or "WHAT\0ERRNO" (the C launcher, which has no
// strerror).
func StatusError(msg string) error {
	what, num, ok := strings.Cut(msg, "\x00")
	if !ok {
		return errors.New(msg)
	}
	if n, err := strconv.Atoi(num); err == nil && n > 0 && n < 4096 {
		return fmt.Errorf("%s: %w", what, unix.Errno(n))
	}
	return errors.New(what)
}
