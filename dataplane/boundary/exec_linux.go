package boundary

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
)

// The exec gate (the process class's exec allowlist) on a host without BPF
// LSM: one fanotify group of the agent (FAN_CLASS_CONTENT, FAN_REPORT_TID)
// with a FAN_OPEN_EXEC_PERM mark on every mount of each gated session's
// mount namespace. The mounts of a session's namespace are its own (made
// by unshare and by the view's binds), so the marks see that session's
// execs only; the event's task is judged by its effective uid, which names
// the session (each session has its own). For every exec-open (the program,
// a script's interpreter, an ELF interpreter) the kernel blocks the task
// until the agent answers: the file (device and inode, read from the
// event's descriptor) must be one the session's live grants name, resolved
// in the session's view when they were applied (symlinks followed), or the
// ELF interpreter (PT_INTERP) of the program this same task was just let
// execute. Anything else is denied (EPERM). So a grant or a revoke reaches
// the next exec of every running process: revocable at next use.
//
// What the marks cannot see: a memfd (its mount is the kernel's and takes
// no mark), so a gated session's PID namespace gets vm.memfd_noexec=2
// (every memfd is made non-executable, sealed); a file on a mount the
// session's namespace does not have (a descriptor a host process passes
// in through a granted socket); a mount attached by a later view change
// between its attach and its mark (the view marks it before the change
// returns); mounts of a user namespace the session makes itself (the row is
// unavailable when sessions may make user namespaces). While the agent is
// down the kernel drops the group's marks (pending and later execs are
// allowed); the agent re-arms every gated session when it opens again.

// execState is the boundary's exec gate and the sessions' process state.
type execState struct {
	once sync.Once
	err  error // the gate could not be made
	g    atomic.Pointer[execGate]

	mu       sync.Mutex
	sessions map[string]*procState

	report atomic.Pointer[func(ExecDenial)] // OnExecDenial's callback
}

// procState is one gated session's process state.
type procState struct {
	bound uint32 // RLIMIT_NPROC of its processes (0: no new process)
	memfd bool   // memfd_noexec set in its PID namespace
}

type fileID struct{ dev, ino uint64 }

// execPolicy is what one session (by uid) may execute.
type execPolicy struct {
	session string            // the session's name (its denials name it)
	progs   map[fileID]string // the granted programs, resolved
	interp  map[fileID]fileID // a granted ELF program's interpreter
}

// execGate is the fanotify group and its decisions.
type execGate struct {
	f       *os.File
	mu      sync.Mutex
	byUID   map[uint32]*execPolicy
	pending map[int32]fileID // per task: the interpreter its exec may open next
	report  func(fd, tid int32, session string)
	denied  atomic.Uint64
	allowed atomic.Uint64
}

// ExecDenials and ExecAllowed count the gate's answers since it was made.
func (b *Boundary) ExecDenials() uint64 {
	if g := b.exec.g.Load(); g != nil {
		return g.denied.Load()
	}
	return 0
}

// ExecAnswers is how many exec-opens of gated sessions the gate allowed.
func (b *Boundary) ExecAnswers() uint64 {
	if g := b.exec.g.Load(); g != nil {
		return g.allowed.Load()
	}
	return 0
}

// ExecGateProbe says whether this host can gate execs (fanotify permission
// events with mount marks, memfd_noexec per PID namespace), changing
// nothing but a throwaway group.
func ExecGateProbe() error {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_REPORT_TID, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_LARGEFILE)
	if err != nil {
		return fmt.Errorf("fanotify_init(FAN_CLASS_CONTENT): %w", err)
	}
	defer unix.Close(fd)
	// A mark on a mount of ours, removed again: the kernel takes
	// FAN_OPEN_EXEC_PERM mount marks.
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_MOUNT, unix.FAN_OPEN_EXEC_PERM, unix.AT_FDCWD, "/proc/self/exe"); err != nil {
		return fmt.Errorf("fanotify_mark(FAN_OPEN_EXEC_PERM, mount): %w", err)
	}
	if _, err := os.Stat("/proc/sys/vm/memfd_noexec"); err != nil {
		return fmt.Errorf("vm.memfd_noexec (Linux 6.3): %w", err)
	}
	return nil
}

func (b *Boundary) gate() (*execGate, error) {
	b.exec.once.Do(func() {
		fd, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_REPORT_TID, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_LARGEFILE)
		if err != nil {
			b.exec.err = fmt.Errorf("exec gate: fanotify_init: %w", err)
			return
		}
		g := &execGate{f: os.NewFile(uintptr(fd), "fanotify-exec"), byUID: map[uint32]*execPolicy{}, pending: map[int32]fileID{}, report: b.reportDenial}
		b.exec.g.Store(g)
		go g.loop()
	})
	return b.exec.g.Load(), b.exec.err
}

// closeExec stops the gate (Close): its marks go with the group.
func (b *Boundary) closeExec() {
	if g := b.exec.g.Load(); g != nil {
		_ = g.f.Close()
	}
}

// ProcessBound is the RLIMIT_NPROC of session name's launches: its gated
// bound, else the host's; gated reports whether the session is gated.
func (b *Boundary) ProcessBound(name string) (bound uint32, gated bool) {
	b.exec.mu.Lock()
	defer b.exec.mu.Unlock()
	if s := b.exec.sessions[name]; s != nil {
		return s.bound, true
	}
	return b.cfg.MaxProcs, false
}

// HostMaxProcs is the host's bound of every session's processes
// (Config.MaxProcs).
func (b *Boundary) HostMaxProcs() uint32 { return b.cfg.MaxProcs }

// launchNProc is the RLIMIT_NPROC a launch in session name gets; a gated
// session with no live process grant gets no new process.
func (b *Boundary) launchNProc(name string) (uint64, error) {
	n, gated := b.ProcessBound(name)
	if gated && n == 0 {
		return 0, fmt.Errorf("%w: session %s: no live process grant (its processes are bounded to none)", backend.ErrNotSupported, name)
	}
	return uint64(n), nil
}

// CheckPrograms resolves programs in session name's view, changing
// nothing: each must be a regular file with an execute bit.
func (b *Boundary) CheckPrograms(name string, programs []string) error {
	h, err := b.holderOf(name)
	if err != nil {
		return err
	}
	_, err = resolvePrograms(h.pid, programs, false)
	return err
}

// holderOf is session name's holder, started (lazy_linux.go): resolving
// programs in its view needs its mount namespace.
func (b *Boundary) holderOf(name string) (*holder, error) {
	return b.holderFor(name, true, true)
}

// ExecGateReady says why this boundary cannot gate execs (nil: it can).
// Besides the host (ExecGateProbe): the binary each launch executes in the
// session's mount namespace must have no ELF interpreter. The agent's
// fork waits (vfork) until that exec is done, with its runtime unable to
// stop the world; an interpreter loaded through the session's marked
// mounts would need the gate's answer, which may wait for a garbage
// collection: a deadlock. The C launcher is static.
func (b *Boundary) ExecGateReady() error {
	if b.cfg.AllowUserNS {
		return errors.New("sessions may make user namespaces here (SessionAllowUserNS): a mount namespace of their own has mounts no mark sees")
	}
	exe := b.cexe
	if exe == nil {
		exe = b.exe
	}
	ef, err := elf.NewFile(exe)
	if err != nil {
		return fmt.Errorf("the launcher: %w", err)
	}
	for _, ph := range ef.Progs {
		if ph.Type == elf.PT_INTERP {
			return fmt.Errorf("launches execute %s, which has an ELF interpreter: the exec gate needs a static launcher (the C launcher, cmd/shinken-exec, built by make)", b.launcher)
		}
	}
	return ExecGateProbe()
}

// SetProcess gates session name (from the first call on, for its life):
// it may execute programs (resolved in its view now; with lenient, one
// that no longer resolves is left out instead of failing the call) and
// have bound processes, applied to its running processes too.
func (b *Boundary) SetProcess(name string, programs []string, bound uint32, lenient bool) error {
	if err := b.ExecGateReady(); err != nil {
		return fmt.Errorf("%w: process: %w", backend.ErrNotSupported, err)
	}
	h, err := b.holderOf(name)
	if err != nil {
		return err
	}
	pol, err := resolvePrograms(h.pid, programs, lenient)
	if err != nil {
		return err
	}
	pol.session = name
	g, err := b.gate()
	if err != nil {
		return err
	}
	b.exec.mu.Lock()
	defer b.exec.mu.Unlock()
	if b.exec.sessions == nil {
		b.exec.sessions = map[string]*procState{}
	}
	s := b.exec.sessions[name]
	if s == nil {
		s = &procState{}
	}
	if !s.memfd {
		if err := b.memfdNoExec(h); err != nil {
			return err
		}
		s.memfd = true
	}
	// The policy first, then the marks: a mount marked before its
	// policy would deny every exec of the session meanwhile, which is
	// safe, but the order makes the first grant exact.
	g.mu.Lock()
	g.byUID[h.uid] = pol
	g.mu.Unlock()
	b.exec.sessions[name] = s
	if err := markMounts(g, h.pid); err != nil {
		return err
	}
	return s.setBound(h, bound)
}

// markExec marks the mounts a view change attached, in a gated session
// (called by updateView before it returns).
func (b *Boundary) markExec(name string, h *holder) error {
	b.exec.mu.Lock()
	defer b.exec.mu.Unlock()
	g := b.exec.g.Load()
	if b.exec.sessions[name] == nil || g == nil {
		return nil
	}
	return markMounts(g, h.pid)
}

// dropProcess forgets session name (its holder is gone).
func (b *Boundary) dropProcess(name string, uid uint32) {
	b.exec.mu.Lock()
	delete(b.exec.sessions, name)
	b.exec.mu.Unlock()
	if g := b.exec.g.Load(); g != nil {
		g.mu.Lock()
		delete(g.byUID, uid)
		g.mu.Unlock()
	}
}

// resolvePrograms opens each program in the view of holder pid (its root:
// symlinks resolved inside it) and reads its identity and its ELF
// interpreter's.
func resolvePrograms(pid int, programs []string, lenient bool) (*execPolicy, error) {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("session view: %w", err)
	}
	defer unix.Close(root)
	pol := &execPolicy{progs: map[fileID]string{}, interp: map[fileID]fileID{}}
	for _, p := range programs {
		id, interp, err := resolveProgram(root, p)
		if err != nil {
			if lenient {
				continue
			}
			return nil, fmt.Errorf("%w: exec %s: %w", backend.ErrInvalidProcessEntry, p, err)
		}
		pol.progs[id] = p
		if interp != "" {
			iid, _, err := resolveProgram(root, interp)
			if err != nil {
				if lenient {
					continue
				}
				return nil, fmt.Errorf("%w: exec %s: its interpreter %s: %w", backend.ErrInvalidProcessEntry, p, interp, err)
			}
			pol.interp[id] = iid
		}
	}
	return pol, nil
}

func resolveProgram(root int, p string) (fileID, string, error) {
	fd, err := unix.Openat2(root, strings.TrimPrefix(p, "/"), &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return fileID{}, "", err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		return fileID{}, "", errors.New("not an executable regular file")
	}
	interp := ""
	if ef, err := elf.NewFile(f); err == nil {
		for _, ph := range ef.Progs {
			if ph.Type == elf.PT_INTERP {
				buf := make([]byte, min(ph.Filesz, 4096))
				if _, err := ph.ReadAt(buf, 0); err == nil {
					interp = strings.TrimRight(string(buf), "\x00")
				}
			}
		}
	}
	return fileID{uint64(st.Dev), st.Ino}, interp, nil
}

// markMounts marks every mount of holder pid's namespace, each call anew:
// adding a mark is idempotent, and a mount id is reused once its mount is
// gone, so no id is remembered as marked.
func markMounts(g *execGate, pid int) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return fmt.Errorf("exec gate: session mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		mp := unescapeMount(fs[4])
		err = unix.FanotifyMark(int(g.f.Fd()), unix.FAN_MARK_ADD|unix.FAN_MARK_MOUNT, unix.FAN_OPEN_EXEC_PERM, unix.AT_FDCWD, fmt.Sprintf("/proc/%d/root%s", pid, mp))
		switch {
		case err == nil:
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EINVAL) && isPseudo(fs):
			// Covered by a later mount (unreachable), or a pseudo file
			// system that takes no mount mark and holds nothing
			// executable (proc, sysfs, cgroup2: all noexec here).
		default:
			return fmt.Errorf("exec gate: mark %s: %w", mp, err)
		}
	}
	return sc.Err()
}

func isPseudo(fields []string) bool {
	for i, f := range fields {
		if f == "-" && i+1 < len(fields) {
			switch fields[i+1] {
			case "proc", "sysfs", "cgroup2", "cgroup", "mqueue", "devpts", "bpf", "nsfs":
				return true
			}
		}
	}
	return false
}

// memfdNoExec sets vm.memfd_noexec=2 in h's PID namespace (a child of a
// thread that joined it writes it: the sysctl is the writer's namespace's).
func (b *Boundary) memfdNoExec(h *holder) error {
	pidfd, err := h.open()
	if err != nil {
		return fmt.Errorf("session holder: %w", err)
	}
	defer unix.Close(pidfd)
	// The thread's PID namespace for children is the session's.
	return throwaway.Run(func() error {
		if err := unix.Setns(pidfd, unix.CLONE_NEWPID); err != nil {
			return fmt.Errorf("join session PID namespace: %w", err)
		}
		cmd := &exec.Cmd{Path: "/proc/self/fd/3", Args: []string{child.MemfdArg0}, ExtraFiles: []*os.File{b.exe}, Env: []string{}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("vm.memfd_noexec=2 in the session's PID namespace: %w: %s", err, strings.TrimSpace(string(out)))
		}
		return err
	})
}

// loop answers the group's permission events until the group is closed.
func (g *execGate) loop() {
	buf := make([]byte, 64*unix.FAN_EVENT_METADATA_LEN)
	for {
		n, err := g.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			return
		}
		for off := 0; off+unix.FAN_EVENT_METADATA_LEN <= n; {
			m := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
			if m.Event_len < unix.FAN_EVENT_METADATA_LEN {
				break
			}
			if m.Fd >= 0 {
				ok, session := g.decide(m.Fd, m.Pid)
				g.respond(m.Fd, ok)
				if !ok {
					// After the answer: the refused task is not kept
					// waiting on the report.
					g.report(m.Fd, m.Pid, session)
				}
				unix.Close(int(m.Fd))
			}
			off += int(m.Event_len)
		}
	}
}

func (g *execGate) respond(fd int32, allow bool) {
	var r [8]byte
	binary.NativeEndian.PutUint32(r[0:], uint32(fd))
	ans := uint32(unix.FAN_ALLOW)
	if !allow {
		ans = unix.FAN_DENY
		g.denied.Add(1)
	} else {
		g.allowed.Add(1)
	}
	binary.NativeEndian.PutUint32(r[4:], ans)
	_, _ = g.f.Write(r[:])
}

// decide answers one exec-open of file fd by task tid, and names the
// gated session whose task it is (empty: none, or unknown).
func (g *execGate) decide(fd, tid int32) (bool, string) {
	uid, err := euidOf(tid)
	if err != nil {
		return false, "" // the task is gone or unreadable: never open by default
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	pol := g.byUID[uid]
	if pol == nil {
		return true, "" // not a gated session's task (the agent's own launch steps run as root)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil {
		return false, pol.session
	}
	id := fileID{uint64(st.Dev), st.Ino}
	want, hasPending := g.pending[tid]
	delete(g.pending, tid)
	if _, ok := pol.progs[id]; ok {
		if in, ok := pol.interp[id]; ok {
			if len(g.pending) > 1<<16 {
				clear(g.pending) // failed execs left these: dropping them only denies
			}
			g.pending[tid] = in
		}
		return true, pol.session
	}
	return hasPending && want == id, pol.session
}

// euidOf reads the effective uid of task tid.
func euidOf(tid int32) (uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(v)
			if len(f) < 2 {
				break
			}
			u, err := strconv.ParseUint(f[1], 10, 32)
			return uint32(u), err
		}
	}
	return 0, errors.New("no Uid line")
}
