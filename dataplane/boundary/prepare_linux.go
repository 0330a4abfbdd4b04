package boundary

// Prepared launches: what Launch does, split in two, so that another
// process than the agent (the session runtime's per-process shim) starts
// the session process and is its parent. Prepare runs in the agent (the
// one door: it checks the identity, builds the launcher's spec with the
// seccomp filter, makes the run's cgroup and opens the holder); package
// prepared's Start (StartPrepared here) runs in the shim, with the
// descriptors Prepare opened, and does what Launch's locked thread does:
// join the holder's namespaces and start the launcher in the run's cgroup.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/prepared"
	"golang.org/x/sys/unix"
)

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
		dir = b.startDir(name, h)
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
	js, err := json.Marshal(prepared.Launch{NS: b.useNS, Dir: dir, Env: env, Launcher: spec.Args(p.Argv), UID: h.uid, Ruleset: rs != nil})
	if err != nil {
		return fail(err, files...)
	}
	if rs != nil {
		files = append(files, rs)
	}
	pl := &backend.PreparedLaunch{Args: []string{prepared.Arg0, string(js)}, Files: files, Tree: r.dir}
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
// process (which becomes its parent): package prepared's Start, which the
// session runtime's shim links without the rest of the boundary.
func StartPrepared(req backend.StartRequest) (backend.Started, error) {
	return prepared.Start(req)
}
