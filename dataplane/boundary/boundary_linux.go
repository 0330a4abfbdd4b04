package boundary

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/prepared"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
	"golang.org/x/sys/unix"
)

// mainCalled is set by Main: New refuses to run in a binary that would not
// recognise its own re-executed modes (it would start a second agent).
var mainCalled bool

// Main runs the re-executed modes (package child) when this binary was
// started as one of them, and never returns then; in any other process it
// returns at once. Binaries that may be re-executed themselves (the agent,
// test binaries: used when the dedicated launcher is missing) call it
// first thing in main or TestMain.
func Main() {
	mainCalled = true
	child.Main()
}

// landlockScopes are the Landlock IPC scopes each launch enters (ABI 6):
// LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL.
const landlockScopes = 1 | 2

// Boundary makes and holds the session boundary of every session: the
// per-session namespaces (through their holder process) and the launcher.
// Safe for concurrent use.
type Boundary struct {
	cfg      Config
	exe      *os.File // the launcher binary (or our own), re-executed in the session modes
	cexe     *os.File // the C launcher, executed for launches; nil: exe's launch mode
	launcher string   // what exe and cexe are, for the report
	filter   []byte   // the seccomp filter, assembled once (struct sock_filter array)
	report   []backend.Strength
	ready    error // why sessions cannot be created, nil when they can

	useNS, useSeccomp, useLandlock bool
	useLandlockFS                  bool         // the Landlock baseline (landlock_linux.go)
	persistOverlay                 error        // nil: persistent paths are overlays (overlay_linux.go); else why binds
	llTree                         landlockTree // its rules, cached
	rulesets                       rulesetCache // each session's built ruleset (ruleset_linux.go)
	directInit                     bool         // holders made from a thread of ours (see startHolder)
	holderHow                      string       // how holders are made, for the report
	landlockABI                    int
	tmpfsErr                       error // the probe session's tmpfs mounts are not of TmpfsBytes

	// Test knobs: remove one protection to show a test fails without it.
	sharedUID uint32 // every session runs as this uid when non-zero

	exec execState // the exec gate and the gated sessions (exec_linux.go)

	viewMu      sync.Mutex // orders view changes (view_linux.go)
	viewChanges atomic.Uint64

	idmapMu sync.Mutex
	idmaps  idmapCache // user namespaces for idmapped mounts (idmap_linux.go)

	mu      sync.Mutex
	holders map[string]*holder
	// holderStarts counts the holders started (lazy_linux.go).
	holderStarts atomic.Uint64
	views        map[string]*sessionView // the view of each session this agent laid out (view_linux.go)
	specs        map[string]*ViewSpec    // what each session's view is made of, also after a failed change
	runs         map[*os.Process]*run    // runs started with their own cgroup, until they are removed
	runSeq       atomic.Uint64
}

// holder is a session's pid 1 (catatonit), which holds its namespaces.
//
// The agent keeps no descriptor for a holder it started (its child): with
// 10,000 sessions every fork the agent makes (each launch, each new
// holder) would copy 10,000 descriptors and close them again at exec (a
// millisecond per fork at 10,000). A child's pid cannot be reused before
// its parent reaps it, and only release reaps it, so pidfd_open(pid) at
// use names the holder. An adopted holder (started by an earlier agent;
// its parent is now another process, which reaps it when it dies, and its
// pid may then be reused) is named the same way, and the pidfd checked
// before use: the process must still be pid 1 of a PID namespace one
// level below ours, in the session's cgroup (openHolder). No descriptor is
// kept for it either, so an agent that adopted 10,000 sessions forks as
// cheaply as one that made them.
//
// A holder starts lazily (lazy_linux.go): Create records the session with
// no process (pid 0, started false), and the first operation that needs
// the session's namespaces starts it (ensureHolder), exactly once.
type holder struct {
	pid    int    // 0 until started; set once, under mu, before started
	cgroup string // the session cgroup directory
	uid    uint32
	child  bool // our child: reaped by release

	startMu sync.Mutex  // serializes starting it (ensureHolder)
	started atomic.Bool // pid names a running holder (set under the boundary's viewMu)

	mu   sync.Mutex
	gone bool // released: a child's pid may be reaped and reused
}

// open returns a new pidfd of the holder (close-on-exec), which the caller
// closes; after release, or before it was started, it fails.
func (h *holder) open() (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.gone:
		return -1, fmt.Errorf("holder %d: %w", h.pid, unix.ESRCH)
	case h.pid <= 0:
		return -1, fmt.Errorf("holder not started: %w", unix.ESRCH)
	case h.child:
		return unix.PidfdOpen(h.pid, 0)
	}
	return openHolder(h.cgroup, h.pid)
}

// New validates cfg against the dataplane's maxSessions, opens our own
// binary and probes every mechanism of the boundary on this host. A
// mechanism that is unavailable and not accepted by cfg.Accept does not
// fail New: Report says so and Create refuses with the reason.
func New(cfg Config, maxSessions uint32) (*Boundary, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(maxSessions); err != nil {
		return nil, err
	}
	exe, what, err := openLauncher(cfg.Launcher)
	if err != nil {
		return nil, err
	}
	b := &Boundary{cfg: cfg, exe: exe, holders: map[string]*holder{}, runs: map[*os.Process]*run{}, views: map[string]*sessionView{}, specs: map[string]*ViewSpec{}}
	b.cexe, b.launcher = openExec(cfg.Exec, cfg.Launcher, what)
	if b.filter, err = rawFilter(cfg.filterOptions()); err != nil {
		b.Close()
		return nil, err
	}
	b.probe()
	return b, nil
}

// Close closes the descriptors the boundary holds; the sessions' holders
// keep running (a new agent adopts them).
func (b *Boundary) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for n, h := range b.holders {
		h.mu.Lock()
		h.gone = true // not reaped: a new agent adopts it
		h.mu.Unlock()
		delete(b.holders, n)
		b.rulesets.drop(n, true)
	}
	if b.cexe != nil {
		b.cexe.Close()
	}
	b.closeIdmaps()
	b.closeExec()
	return b.exe.Close()
}

// Report is the boundary's rows of the enforcement report, as probed.
func (b *Boundary) Report() []backend.Strength { return append([]backend.Strength(nil), b.report...) }

// FilterLen is the number of BPF instructions of the seccomp filter the
// boundary installs in every session process.
func (b *Boundary) FilterLen() int { return len(b.filter) / 8 }

// Ready says why sessions cannot be created on this host (nil if they can).
func (b *Boundary) Ready() error { return b.ready }

// UID is the uid and gid of the session with kernel index index.
func (b *Boundary) UID(index uint32) (uint32, error) {
	if b.sharedUID != 0 {
		return b.sharedUID, nil
	}
	return b.cfg.UID(index)
}

// Create records a new session's boundary: no process and no namespace
// yet. Its holder starts at the first operation that needs the session's
// namespaces (ensureHolder: a launch, a file get or put, a process
// grant), directly in the session cgroup, and its view is laid out then
// from what the session's spec says at that moment. The session's
// processes run as UID(index).
func (b *Boundary) Create(name, cgroup string, index uint32) error {
	if b.ready != nil {
		return b.ready
	}
	uid, err := b.UID(index)
	if err != nil {
		return err
	}
	h := &holder{cgroup: cgroup, uid: uid}
	b.mu.Lock()
	if old, ok := b.holders[name]; ok {
		b.release(old)
	}
	delete(b.views, name) // a new mount namespace: nothing laid out yet
	delete(b.specs, name)
	b.holders[name] = h
	b.rulesets.drop(name, false)
	b.mu.Unlock()
	return nil
}

// Adopt finds the holder of a session that an earlier agent made (the
// process in the session cgroup that is pid 1 of a PID namespace one level
// below ours), or records the session with no holder if there is none (it
// never started one, or its namespaces died with their holder, and so did
// every process in them): its next operation that needs them starts one,
// as after Create.
func (b *Boundary) Adopt(name, cgroup string, index uint32) error {
	// Runs of an earlier agent: empty run cgroups go now; the processes of
	// a run still going keep their cgroup (they end with the session: no
	// agent watches their first process any more).
	procs, scanErr := adoptScan(cgroup)
	if !b.useNS {
		return b.Create(name, cgroup, index)
	}
	if scanErr != nil {
		return fmt.Errorf("boundary: adopt %s: %w", name, scanErr)
	}
	pid, pidfd, err := findHolder(cgroup, procs)
	if err != nil {
		return fmt.Errorf("boundary: adopt %s: %w", name, err)
	}
	if pidfd < 0 {
		return b.Create(name, cgroup, index)
	}
	unix.Close(pidfd) // verified; opened again, and checked again, at each use
	uid, err := b.UID(index)
	if err != nil {
		return err
	}
	h := &holder{pid: pid, cgroup: cgroup, uid: uid}
	h.started.Store(true)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holders[name] = h
	b.rulesets.drop(name, false)
	return nil
}

// Release forgets a session whose cgroup was killed: it kills the holder
// and, when this agent started it, reaps it.
func (b *Boundary) Release(name string) {
	b.mu.Lock()
	h, ok := b.holders[name]
	delete(b.holders, name)
	delete(b.views, name)
	delete(b.specs, name)
	b.mu.Unlock()
	b.rulesets.drop(name, true)
	if ok {
		b.release(h)
		b.dropProcess(name, h.uid)
	}
	if b.cfg.PersistDir != "" {
		// What this session alone kept goes with it.
		_, session := b.persistDirs(name)
		_ = os.RemoveAll(session)
	}
}

func (b *Boundary) release(h *holder) {
	h.mu.Lock()
	defer h.mu.Unlock() // open waits: it never returns a reaped pid
	if h.gone {
		return
	}
	h.gone = true
	switch {
	case h.pid <= 0: // never started: nothing to kill
	case h.child:
		_ = unix.Kill(h.pid, unix.SIGKILL) // not reaped yet: still ours
		reap(h)
	default: // adopted: killed through a checked pidfd (gone already: nothing to do)
		if fd, err := openHolder(h.cgroup, h.pid); err == nil {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			unix.Close(fd)
		}
	}
}

// reap waits (up to 5 s) for the holder, our child, to exit.
func reap(h *holder) {
	for i := 0; i < 500; i++ {
		var ws unix.WaitStatus
		n, err := unix.Wait4(h.pid, &ws, unix.WNOHANG, nil)
		if n == h.pid || (err != nil && !errors.Is(err, unix.EINTR)) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// LaunchOptions says who a session process runs as and how it is contained.
type LaunchOptions = backend.LaunchOptions

// run is a launch with its own cgroup below the session's.
type run struct {
	dir   string
	pidfd int
}

// Launch starts cmd inside session name: the one path by which a process
// enters a session. It runs as the session's uid and gid with no
// supplementary group; opts may name them (0: the default) but no other
// (ErrIdentity). The child is created directly in the session cgroup
// (with ownRun, in a new cgroup of its own below it), in the session's
// mount, IPC and PID namespaces, in a new session (setsid) of its own,
// and confined before it executes cmd.Path (resolved inside the session).
//
// With ownRun (what `run` uses), KillRun kills the run's cgroup
// (cgroup.kill), so every process the run started, however it forked
// (setsid, double fork: no unprivileged process leaves its cgroup), and
// the cmd's context cancel (exec.CommandContext) is set to KillRun. The
// run's processes also end when its first process exits: a goroutine waits
// for that exit on a pidfd, kills the cgroup and removes it.
func (b *Boundary) Launch(name string, cmd *exec.Cmd, opts LaunchOptions, ownRun bool) error {
	if b.ready != nil {
		return b.ready
	}
	h, err := b.startedHolder(name)
	if err != nil {
		return err
	}
	nproc, err := b.launchNProc(name)
	if err != nil {
		return err
	}
	spec := child.Launch{Path: cmd.Path, UID: h.uid, GID: h.uid, Privileged: opts.Privileged, NProc: nproc}
	if b.useSeccomp {
		spec.Filter = b.filter
	}
	if b.useLandlock {
		spec.Landlock = landlockScopes
	}
	var llKey string
	spec.FS, spec.FSRules, llKey = b.landlockSpec(name)
	// A uid or gid of 0 is the default, the session's own; any other
	// must be that too (the launcher sets no supplementary group).
	if (opts.UID != 0 && opts.UID != h.uid) || (opts.GID != 0 && opts.GID != h.uid) {
		return fmt.Errorf("%w: launch in %s as uid %d gid %d (the session's: %d)", ErrIdentity, name, opts.UID, opts.GID, h.uid)
	}
	if cmd.Dir == "" {
		cmd.Dir = b.startDir(name, h)
	}
	extra := cmd.ExtraFiles
	if spec.FS != 0 && !opts.Privileged && b.useNS {
		rs, err := b.sessionRuleset(name, h, spec.FS, spec.Landlock, spec.FSRules, llKey)
		if err != nil {
			return fmt.Errorf("boundary: launch in %s: %w", name, err)
		}
		defer rs.Close()
		spec.FSRules, spec.Ruleset = nil, 3+len(extra)
		cmd.ExtraFiles = append(slices.Clip(extra), rs)
		defer func() { cmd.ExtraFiles = extra }()
	}
	dir := h.cgroup
	var r *run
	if ownRun {
		var err error
		if r, err = b.newRun(h.cgroup); err != nil {
			return fmt.Errorf("boundary: launch in %s: %w", name, err)
		}
		dir = r.dir
	}
	cg, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.removeRun(r)
		return fmt.Errorf("boundary: open session cgroup %s: %w", dir, err)
	}
	defer unix.Close(cg)
	spec.Status = 3 + len(cmd.ExtraFiles)
	spec.ExeFD = spec.Status + 1
	path, args := cmd.Path, cmd.Args
	if len(args) == 0 {
		args = []string{path}
	}
	origEnv, env := cmd.Env, cmd.Env
	if env == nil {
		env = os.Environ()
	}
	exe := b.cexe
	if exe == nil {
		exe = b.exe
	}
	if b.cexe == nil && !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "GOMAXPROCS=") }) {
		spec.DropEnv = true
		cmd.Env = append(env[:len(env):len(env)], child.StartEnv)
	}
	cmd.Path = fmt.Sprintf("/proc/self/fd/%d", spec.ExeFD)
	cmd.Args = spec.Args(args)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	sys := cmd.SysProcAttr
	sys.UseCgroupFD, sys.CgroupFD = true, cg
	// Its own session, so its own process group and autogroup: nothing a
	// session runs shares the agent's (whose CPU weight is raised, and
	// whose process group a terminal's signals reach).
	sys.Setsid = true
	sys.Credential, sys.AmbientCaps = nil, nil
	if r != nil {
		if cmd.Cancel != nil {
			// exec.CommandContext: a timeout kills the run's whole tree.
			cmd.Cancel = func() error { return b.KillRun(cmd.Process) }
		}
	}
	if !b.useNS {
		// Without namespaces (accepted by the operator) the launcher
		// re-executes through the host's /proc.
		err = prepared.StartReporting(cmd, exe)
	} else {
		var pidfd int
		if pidfd, err = h.open(); err != nil {
			cmd.Path, cmd.Args, cmd.Env = path, args, origEnv
			b.removeRun(r)
			return fmt.Errorf("boundary: launch in %s: session holder: %w", name, err)
		}
		defer unix.Close(pidfd)
		// This thread joins the session's namespaces (Go never creates
		// threads from a locked one).
		err = throwaway.Run(func() error {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("unshare(CLONE_FS): %w", err)
			}
			if err := unix.Setns(pidfd, prepared.NSFlags); err != nil {
				return fmt.Errorf("join session namespaces (setns pidfd): %w", err)
			}
			return prepared.StartReporting(cmd, exe)
		})
	}
	cmd.Path, cmd.Args = path, args
	cmd.Env = origEnv
	if err != nil {
		b.removeRun(r)
		return fmt.Errorf("boundary: launch in %s: %w", name, prepared.ExecFault(err))
	}
	if r != nil {
		// A pidfd of our own (non-blocking, for the netpoller; the one
		// os.Process holds must stay blocking for its Wait). The child
		// cannot be reaped before Launch returns, so the pid names it.
		if r.pidfd, err = unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK); err != nil {
			r.pidfd = -1
		}
		b.mu.Lock()
		b.runs[cmd.Process] = r
		b.mu.Unlock()
		go b.endRun(cmd.Process, r)
	}
	return nil
}

// newRun makes a new cgroup for one run below the session's cgroup: owned
// by root, so the run's processes can neither leave it (moving a process
// needs write access to the cgroup.procs of the common ancestor, the
// session's) nor make cgroups below it.
func (b *Boundary) newRun(session string) (*run, error) {
	for {
		dir := filepath.Join(session, fmt.Sprintf("run-%d", b.runSeq.Add(1)))
		err := unix.Mkdir(dir, 0o755)
		if err == nil {
			return &run{dir: dir, pidfd: -1}, nil
		}
		if !errors.Is(err, unix.EEXIST) { // else left by an earlier agent: next number
			return nil, fmt.Errorf("make run cgroup: %w", err)
		}
	}
}

// endRun waits (in the netpoller, no thread held) until the run's first
// process has exited, then kills and removes the run's cgroup.
func (b *Boundary) endRun(p *os.Process, r *run) {
	if r.pidfd >= 0 {
		f := os.NewFile(uintptr(r.pidfd), "pidfd")
		if rc, err := f.SyscallConn(); err == nil {
			_ = rc.Read(func(fd uintptr) bool {
				n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
				return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
			})
		}
		f.Close()
	}
	r.pidfd = -1
	b.mu.Lock()
	delete(b.runs, p)
	b.mu.Unlock()
	b.removeRun(r)
}

// removeRun kills every process of the run's cgroup and removes it.
func (b *Boundary) removeRun(r *run) {
	if r == nil {
		return
	}
	if r.pidfd >= 0 {
		unix.Close(r.pidfd)
	}
	_ = os.WriteFile(filepath.Join(r.dir, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 2000; i++ {
		if err := unix.Rmdir(r.dir); err == nil || !errors.Is(err, unix.EBUSY) {
			return
		}
		time.Sleep(time.Duration(min(i+1, 50)) * 100 * time.Microsecond)
	}
}

// KillRun kills every process of a run started with ownRun (its cgroup's
// cgroup.kill: the kernel kills them all, and any process they fork
// meanwhile), or p alone if p is not such a run.
func (b *Boundary) KillRun(p *os.Process) error {
	if p == nil {
		return nil
	}
	b.mu.Lock()
	r := b.runs[p]
	b.mu.Unlock()
	if r == nil {
		return p.Kill()
	}
	if err := os.WriteFile(filepath.Join(r.dir, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(fmt.Errorf("boundary: kill run: %w", err), p.Kill())
	}
	return nil
}
