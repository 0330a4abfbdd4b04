package boundary

// Prepared launches: what Launch does, split in two, so that another
// process than the agent (the session runtime's per-process shim) starts
// the session process and is its parent. Prepare runs in the agent (the
// one door: it checks the identity, builds the launcher's spec with the
// seccomp filter, makes the run's cgroup and opens the holder); StartPrepared
// runs in the shim, with the descriptors Prepare opened, and does what
// Launch's locked thread does: join the holder's namespaces and start the
// launcher in the run's cgroup.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/creack/pty"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
	"golang.org/x/sys/unix"
)

// preparedArg0 marks a prepared launch's Args.
const preparedArg0 = "shinken-prepared-v1"

// prepared is the JSON in Args[1]. Files: [launcher binary, run cgroup,
// holder pidfd (with namespaces only), the session's Landlock ruleset
// (with Ruleset only)].
type prepared struct {
	NS       bool     `json:"ns"`
	Dir      string   `json:"dir"`
	Env      []string `json:"env"`
	Launcher []string `json:"launcher"` // the launcher's argv (spec, target argv)
	Ruleset  bool     `json:"ruleset"`  // the last file is the session's Landlock ruleset (child.Launch.Ruleset)
	UID      uint32   `json:"uid"`      // owner of a terminal's slave end
}

// Prepare makes a launch of p in session name ready (see Launch for what
// the launched process gets): its own cgroup below the session's, killed
// whole through backend.PreparedLaunch.Tree.
func (b *Boundary) Prepare(name string, p backend.LaunchSpec, opts LaunchOptions) (*backend.PreparedLaunch, error) {
	if b.ready != nil {
		return nil, b.ready
	}
	if len(p.Argv) == 0 || p.Argv[0] == "" {
		return nil, errors.New("boundary: prepare: empty argv")
	}
	h, err := b.startedHolder(name)
	if err != nil {
		return nil, err
	}
	if (opts.UID != 0 && opts.UID != h.uid) || (opts.GID != 0 && opts.GID != h.uid) {
		return nil, fmt.Errorf("%w: launch in %s as uid %d gid %d (the session's: %d)", ErrIdentity, name, opts.UID, opts.GID, h.uid)
	}
	path, err := lookPath(p.Argv[0], p.Env)
	if err != nil {
		return nil, fmt.Errorf("boundary: prepare in %s: %w", name, err)
	}
	// The starter's child gets [status pipe, launcher binary] at fds 3, 4.
	nproc, err := b.launchNProc(name)
	if err != nil {
		return nil, err
	}
	spec := child.Launch{Path: path, UID: h.uid, GID: h.uid, Privileged: opts.Privileged, NProc: nproc, Status: 3, ExeFD: 4}
	if b.useSeccomp {
		spec.Filter = b.filter
	}
	if b.useLandlock {
		spec.Landlock = landlockScopes
	}
	var llKey string
	spec.FS, spec.FSRules, llKey = b.landlockSpec(name)
	var rs *os.File
	if spec.FS != 0 && !opts.Privileged && b.useNS {
		// The starter's child gets [ruleset, status pipe, launcher
		// binary] at fds 3, 4, 5.
		if rs, err = b.sessionRuleset(name, h, spec.FS, spec.Landlock, spec.FSRules, llKey); err != nil {
			return nil, fmt.Errorf("boundary: prepare in %s: %w", name, err)
		}
		spec.FSRules, spec.Ruleset, spec.Status, spec.ExeFD = nil, 3, 4, 5
	}
	env := append([]string{}, p.Env...)
	if b.cexe == nil {
		spec.DropEnv = true
		env = append(env, child.StartEnv)
	}
	dir := p.Dir
	if dir == "" {
		dir = "/"
	}
	r, err := b.newRun(h.cgroup)
	if err != nil {
		if rs != nil {
			rs.Close()
		}
		return nil, fmt.Errorf("boundary: prepare in %s: %w", name, err)
	}
	fail := func(err error, files ...*os.File) (*backend.PreparedLaunch, error) {
		for _, f := range files {
			f.Close()
		}
		if rs != nil {
			rs.Close()
		}
		b.removeRun(r)
		return nil, fmt.Errorf("boundary: prepare in %s: %w", name, err)
	}
	exe := b.cexe
	if exe == nil {
		exe = b.exe
	}
	// A descriptor of our own: the boundary keeps exe open for later launches.
	ef, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", exe.Fd()))
	if err != nil {
		return fail(err)
	}
	cg, err := os.OpenFile(r.dir, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		return fail(err, ef)
	}
	files := []*os.File{ef, cg}
	if b.useNS {
		fd, err := h.open()
		if err != nil {
			return fail(fmt.Errorf("session holder: %w", err), ef, cg)
		}
		files = append(files, os.NewFile(uintptr(fd), "holder-pidfd"))
	}
	js, err := json.Marshal(prepared{NS: b.useNS, Dir: dir, Env: env, Launcher: spec.Args(p.Argv), UID: h.uid, Ruleset: rs != nil})
	if err != nil {
		return fail(err, files...)
	}
	if rs != nil {
		files = append(files, rs)
	}
	pl := &backend.PreparedLaunch{Args: []string{preparedArg0, string(js)}, Files: files, Tree: r.dir}
	pl.Close = func(abandon bool) {
		for _, f := range files {
			f.Close()
		}
		if abandon {
			b.removeRun(r)
		}
	}
	return pl, nil
}

// lookPath resolves a program name without a slash along the PATH of env
// (the default PATH without one), as exec.Command does for Launch: in the
// agent's view of the file system, which is the session's for everything
// but its private /tmp, /dev/shm and /dev.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue // a relative PATH entry means nothing to a launch
		}
		f := filepath.Join(dir, file)
		if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", fmt.Errorf("%q: %w in PATH %s", file, exec.ErrNotFound, path)
}

// StartPrepared starts a launch that Prepare made ready, from the calling
// process (which becomes its parent): on a locked thread that joins the
// session holder's namespaces, as Launch does. With req.TTY, the terminal
// is opened on that thread from the session's own devpts instance
// (/dev/ptmx of its mount namespace, see child.SessionMounts), so the
// session reaches neither the host's terminals nor another session's; the
// slave end is the process's stdio and controlling terminal (a new
// session). It returns once the launcher has executed the target, or with
// why it could not.
func StartPrepared(req backend.StartRequest) (backend.Started, error) {
	if len(req.Args) != 2 || req.Args[0] != preparedArg0 {
		return backend.Started{}, errors.New("boundary: not a prepared launch")
	}
	var p prepared
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
		err := startReporting(cmd, exe)
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
			if err := unix.Setns(int(req.Files[2].Fd()), nsFlags); err != nil {
				return fmt.Errorf("join session namespaces (setns pidfd): %w", err)
			}
			return start()
		})
	}
	if err != nil {
		return backend.Started{}, fmt.Errorf("boundary: start prepared launch: %w", err)
	}
	return backend.Started{Process: cmd.Process, PTY: master}, nil
}
