package boundary

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// nsFlags are the namespaces each session owns; the network namespace stays
// the host's so the cgroup hooks see every socket.
const nsFlags = unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWIPC

// mainCalled is set by Main: New refuses to run in a binary that would not
// recognise its own re-executed modes (it would start a second agent).
var mainCalled bool

// Boundary makes and holds the session boundary of every session: the
// per-session namespaces (through their holder process) and the launcher.
// Safe for concurrent use.
type Boundary struct {
	cfg    Config
	exe    *os.File // our own binary, re-executed in the session modes
	report []backend.Strength
	ready  error // why sessions cannot be created, nil when they can

	useNS, useSeccomp, useLandlock bool
	landlockABI                    int

	// Test knobs: remove one protection to show a test fails without it.
	sharedUID uint32 // every session runs as this uid when non-zero

	mu      sync.Mutex
	holders map[string]*holder
}

type holder struct {
	pid    int
	pidfd  int
	cgroup string // the session cgroup directory
	uid    uint32
	child  bool // our child: reap it on Release
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
	if !mainCalled {
		return nil, errors.New("boundary: this binary never called boundary.Main, so it cannot be re-executed as a session launcher")
	}
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("boundary: open own binary: %w", err)
	}
	b := &Boundary{cfg: cfg, exe: exe, holders: map[string]*holder{}}
	b.probe()
	return b, nil
}

// Close closes the descriptors the boundary holds; the sessions' holders
// keep running (a new agent adopts them).
func (b *Boundary) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for n, h := range b.holders {
		unix.Close(h.pidfd)
		delete(b.holders, n)
	}
	return b.exe.Close()
}

// Report is the boundary's rows of the enforcement report, as probed.
func (b *Boundary) Report() []backend.Strength { return append([]backend.Strength(nil), b.report...) }

// Ready says why sessions cannot be created on this host (nil if they can).
func (b *Boundary) Ready() error { return b.ready }

// UID is the uid and gid of the session with kernel index index.
func (b *Boundary) UID(index uint32) (uint32, error) {
	if b.sharedUID != 0 {
		return b.sharedUID, nil
	}
	return b.cfg.UID(index)
}

// Create makes the namespaces of a new session: its holder starts directly
// in the session cgroup. The session's processes run as UID(index).
func (b *Boundary) Create(name, cgroup string, index uint32) error {
	if b.ready != nil {
		return b.ready
	}
	uid, err := b.UID(index)
	if err != nil {
		return err
	}
	h := &holder{cgroup: cgroup, uid: uid, pidfd: -1}
	if b.useNS {
		if err := b.startHolder(h); err != nil {
			return fmt.Errorf("boundary: session %s: %w", name, err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.holders[name]; ok {
		b.release(old)
	}
	b.holders[name] = h
	return nil
}

func (b *Boundary) startHolder(h *holder) error {
	cg, err := unix.Open(h.cgroup, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open session cgroup: %w", err)
	}
	defer unix.Close(cg)
	spec, _ := json.Marshal(initSpec{Status: 3, Catatonit: b.cfg.Catatonit})
	cmd := &exec.Cmd{Path: "/proc/self/fd/4", Args: []string{initArg0, string(spec)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: nsFlags, UseCgroupFD: true, CgroupFD: cg, Setsid: true}
	if err := startReporting(cmd, b.exe); err != nil {
		return fmt.Errorf("session init: %w", err)
	}
	h.pid, h.child = cmd.Process.Pid, true
	h.pidfd, err = unix.PidfdOpen(h.pid, 0)
	_ = cmd.Process.Release() // reaped by Release, with the pidfd
	if err != nil {
		_ = unix.Kill(h.pid, unix.SIGKILL)
		reap(h)
		return fmt.Errorf("pidfd_open holder: %w", err)
	}
	// The status pipe also closes when the child dies before its exec
	// (the kernel sets the new comm before it closes close-on-exec fds):
	// make sure it is catatonit that holds the namespaces.
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", h.pid))
	if want := filepath.Base(b.cfg.Catatonit); strings.TrimSpace(string(comm)) != want[:min(len(want), 15)] {
		_ = unix.PidfdSendSignal(h.pidfd, unix.SIGKILL, nil, 0)
		reap(h)
		unix.Close(h.pidfd)
		return fmt.Errorf("session init died before it executed %s (comm %q)", b.cfg.Catatonit, strings.TrimSpace(string(comm)))
	}
	return nil
}

// startReporting starts cmd (our binary in a session mode: its status pipe
// at fd 3+len(ExtraFiles), the binary at the next fd) and waits until it
// has executed its final program (the pipe closes on exec) or reported why
// it could not. On failure the child is reaped.
func startReporting(cmd *exec.Cmd, exe *os.File) error {
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
		return errors.New(string(msg))
	}
	return nil
}

// Adopt finds the holder of a session that an earlier agent made (the
// process in the session cgroup that is pid 1 of a PID namespace one level
// below ours), or makes a new one if there is none (its namespaces died
// with their holder, and so did every process in them).
func (b *Boundary) Adopt(name, cgroup string, index uint32) error {
	if !b.useNS {
		return b.Create(name, cgroup, index)
	}
	pid, pidfd, err := findHolder(cgroup)
	if err != nil {
		return fmt.Errorf("boundary: adopt %s: %w", name, err)
	}
	if pidfd < 0 {
		return b.Create(name, cgroup, index)
	}
	uid, err := b.UID(index)
	if err != nil {
		unix.Close(pidfd)
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holders[name] = &holder{pid: pid, pidfd: pidfd, cgroup: cgroup, uid: uid}
	return nil
}

// Release forgets a session whose cgroup was killed: it reaps the holder
// (when this agent started it) and closes its pidfd.
func (b *Boundary) Release(name string) {
	b.mu.Lock()
	h, ok := b.holders[name]
	delete(b.holders, name)
	b.mu.Unlock()
	if ok {
		b.release(h)
	}
}

func (b *Boundary) release(h *holder) {
	if h.pidfd < 0 {
		return
	}
	_ = unix.PidfdSendSignal(h.pidfd, unix.SIGKILL, nil, 0)
	if h.child {
		reap(h)
	}
	unix.Close(h.pidfd)
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

// Launch starts cmd inside session name: the one path by which a process
// enters a session. The child is created directly in the session cgroup,
// in the session's mount, IPC and PID namespaces, and confined before it
// executes cmd.Path (resolved inside the session).
//
// With ownPIDNS (what `run` uses), cmd.Process is a catatonit in the
// session's PID namespace whose one child, the target, is pid 1 of a PID
// namespace of its own: KillRun kills that pid 1 and with it, by the
// kernel, every process the run started, however it forked (setsid,
// double fork: no process leaves a PID namespace). The cmd's context
// cancel (exec.CommandContext) is set to KillRun. The run's processes also
// end when its first process exits.
func (b *Boundary) Launch(name string, cmd *exec.Cmd, opts LaunchOptions, ownPIDNS bool) error {
	if b.ready != nil {
		return b.ready
	}
	b.mu.Lock()
	h, ok := b.holders[name]
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s (no session boundary)", backend.ErrSessionNotFound, name)
	}
	spec := launchSpec{Path: cmd.Path, UID: h.uid, GID: h.uid, Privileged: opts.Privileged,
		NoSeccomp: !b.useSeccomp, NoLandlock: !b.useLandlock, AllowUserNS: b.cfg.AllowUserNS}
	if opts.UID != 0 || opts.GID != 0 {
		if opts.UID == 0 && !opts.Privileged {
			return fmt.Errorf("boundary: launch in %s: uid 0 requires privileged", name)
		}
		spec.UID, spec.GID = opts.UID, opts.GID
		if spec.GID == 0 && !opts.Privileged {
			spec.GID = h.uid // never the root group by omission
		}
	}
	if ownPIDNS && b.useNS {
		spec.Reaper = b.cfg.Catatonit
	}
	cg, err := unix.Open(h.cgroup, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("boundary: open session cgroup %s: %w", h.cgroup, err)
	}
	defer unix.Close(cg)
	spec.Status = 3 + len(cmd.ExtraFiles)
	spec.ExeFD = spec.Status + 1
	js, _ := json.Marshal(spec)
	path, args := cmd.Path, cmd.Args
	if len(args) == 0 {
		args = []string{path}
	}
	cmd.Path = fmt.Sprintf("/proc/self/fd/%d", spec.ExeFD)
	cmd.Args = append([]string{launchArg0, string(js)}, args...)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	sys := cmd.SysProcAttr
	sys.UseCgroupFD, sys.CgroupFD = true, cg
	sys.Credential, sys.AmbientCaps = nil, nil
	if spec.Reaper != "" && cmd.Cancel != nil {
		// exec.CommandContext: a timeout kills the run's whole tree.
		cmd.Cancel = func() error { return KillRun(cmd.Process) }
	}
	if !b.useNS {
		// Without namespaces (accepted by the operator) the launcher
		// re-executes through the host's /proc.
		err = startReporting(cmd, b.exe)
	} else {
		errc := make(chan error, 1)
		go func() {
			// This thread joins the session's namespaces and is never
			// unlocked: Go ends it when the goroutine returns, and never
			// creates threads from a locked one.
			runtime.LockOSThread()
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				errc <- fmt.Errorf("unshare(CLONE_FS): %w", err)
				return
			}
			if err := unix.Setns(h.pidfd, nsFlags); err != nil {
				errc <- fmt.Errorf("join session namespaces (setns pidfd): %w", err)
				return
			}
			errc <- startReporting(cmd, b.exe)
		}()
		err = <-errc
	}
	cmd.Path, cmd.Args = path, args
	if err != nil {
		return fmt.Errorf("boundary: launch in %s: %w", name, err)
	}
	return nil
}

// KillRun kills a run started with ownPIDNS: first the pid 1 of its PID
// namespace (the kernel then kills everything in it), then the reaper p.
func KillRun(p *os.Process) error {
	if p == nil {
		return nil
	}
	path := fmt.Sprintf("/proc/%d/task/%d/children", p.Pid, p.Pid)
	if data, err := os.ReadFile(path); err == nil {
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue
			}
			// Still p's child after the pidfd was taken: the pidfd names it.
			if again, _ := os.ReadFile(path); slices.Contains(strings.Fields(string(again)), f) {
				_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			}
			unix.Close(fd)
		}
	}
	return p.Kill()
}
