package procs

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
)

// Door is the agent's launch door (agent.Agent.PrepareLaunch): every
// process enters a session through it, recorded first. beside runs on the
// prepared launch while the record is made durable and must start
// nothing; the door returns the launch only once the record is durable.
type Door interface {
	PrepareLaunch(session string, spec backend.LaunchSpec, opts backend.LaunchOptions, actor string, beside func(*backend.PreparedLaunch) error) (*backend.PreparedLaunch, error)
}

// Config configures a Manager.
type Config struct {
	// Dir holds one directory per process (under the agent's state dir).
	Dir  string
	Door Door
	// Shim is the binary re-executed as each process's shim (it must call
	// ShimMain first thing); "" is the running binary.
	Shim string
	// RingBytes bounds what each output stream keeps on disk (default
	// 1 MiB; at most 1 GiB).
	RingBytes uint64
	// StartTimeout bounds a start, from the shim's start to the process
	// running (default 10 s).
	StartTimeout time.Duration
}

func (c *Config) validate() error {
	if c.Dir == "" || c.Door == nil {
		return errors.New("procs: config needs Dir and Door")
	}
	if c.RingBytes == 0 {
		c.RingBytes = 1 << 20
	}
	if c.RingBytes < 4096 || c.RingBytes > 1<<30 {
		return fmt.Errorf("procs: ring_bytes %d out of range [4096, 1 GiB]", c.RingBytes)
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 10 * time.Second
	}
	if c.Shim == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("procs: own executable: %w", err)
		}
		c.Shim = self
	}
	return nil
}

// Errors a caller maps to its answers.
var (
	ErrInvalid   = errors.New("procs: invalid request")
	ErrNotFound  = errors.New("procs: no such process")
	ErrNotActive = errors.New("procs: process has ended")
)

// Manager keeps the processes of every session: started through the door,
// each held by its own shim, adopted again from Dir after a restart.
type Manager struct {
	cfg   Config
	mu    sync.Mutex
	procs map[string]*Proc
	// spares: shims started ahead of need (spare.go); starting: the
	// pids of those still starting (tests stop one), and spareWaiters the
	// starts waiting for one of them (each wakes on spareCond, on mu).
	spares        []*spare
	spareStarting int
	starting      map[int]bool
	spareWaiters  int
	spareCond     *sync.Cond
	// working: spares running a job, whose sockets are kept to take them
	// back once it ends (awaitReturn); reused counts those taken back.
	working   map[*spare]bool
	reused    int
	closed    bool
	refills   sync.WaitGroup // refill goroutines running (goRefill); Close waits for them
	unadopted []error        // what Open found and left (Unadopted)
}

// Open adopts the processes found in cfg.Dir (running ones through their
// shims' control sockets; ended ones from their records). known says which
// sessions still exist: the directories of the others are removed.
func Open(cfg Config, known func(session string) bool) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("procs: %w", err)
	}
	m := &Manager{cfg: cfg, procs: map[string]*Proc{}, starting: map[int]bool{}, working: map[*spare]bool{}}
	m.spareCond = sync.NewCond(&m.mu)
	ents, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("procs: %w", err)
	}
	for _, e := range ents {
		dir := filepath.Join(cfg.Dir, e.Name())
		if strings.HasPrefix(e.Name(), spareDirPrefix) {
			os.RemoveAll(dir) // a spare's, with no job: it is gone or going
			continue
		}
		var md meta
		if !e.IsDir() || readJSON(filepath.Join(dir, metaFile), &md) != nil || md.ID != e.Name() {
			continue // not ours, or a start that never finished: left alone
		}
		if known != nil && !known(md.Session) {
			os.RemoveAll(dir)
			continue
		}
		p := newProc(dir, md)
		var st startedRecord
		if readJSON(filepath.Join(dir, startedFile), &st) != nil {
			os.RemoveAll(dir) // its shim never reported a start
			continue
		}
		p.started = st
		if err := p.open(); err != nil {
			// Left as it is (its shim runs on), but said: an agent that
			// cannot read a process's rings does not list it.
			m.unadopted = append(m.unadopted, fmt.Errorf("process %s of session %s: %w", md.ID, md.Session, err))
			continue
		}
		p.adopt()
		m.procs[md.ID] = p
	}
	m.goRefill()
	return m, nil
}

// Unadopted says which processes Open found but could not adopt (their
// rings or ring index unreadable, e.g. started by an older shim without a
// ring index): they are not listed and their shims are left running.
func (m *Manager) Unadopted() []error { return m.unadopted }

// Close drops the agent's connections to the shims; the processes and
// their shims keep running (a new Manager adopts them).
func (m *Manager) Close() {
	m.closeSpares()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.procs {
		p.close()
	}
}

// goRefill starts refill on a goroutine Close waits for (none once
// closed).
func (m *Manager) goRefill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.refills.Add(1)
	go func() {
		defer m.refills.Done()
		m.refill()
	}()
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "p-" + hex.EncodeToString(b[:])
}

func validate(req *wire.ProcessStart) error {
	switch {
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return fmt.Errorf("%w: argv is empty", ErrInvalid)
	case req.UID == 0 && req.GID != 0:
		return fmt.Errorf("%w: gid without uid", ErrInvalid)
	case req.Cwd != "" && !filepath.IsAbs(req.Cwd):
		return fmt.Errorf("%w: cwd %q is not absolute", ErrInvalid, req.Cwd)
	case req.DeadlineS < 0 || req.DeadlineS > 365*24*3600:
		return fmt.Errorf("%w: deadline_s %v out of range [0, one year]", ErrInvalid, req.DeadlineS)
	case req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0 || req.TTY.Rows > 10000 || req.TTY.Cols > 10000):
		return fmt.Errorf("%w: tty size %dx%d out of range [1, 10000]", ErrInvalid, req.TTY.Rows, req.TTY.Cols)
	case req.Stdin != nil && len(*req.Stdin) > maxFrame:
		return fmt.Errorf("%w: stdin over %d bytes: attach and stream it", ErrInvalid, maxFrame)
	}
	for _, s := range append(slices.Clone(req.Argv), append(req.Env, req.Cwd)...) {
		if strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("%w: NUL byte in argv, env or cwd", ErrInvalid)
		}
	}
	for _, e := range req.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("%w: env entry %q is not NAME=VALUE", ErrInvalid, e)
		}
	}
	return nil
}

// Start starts a process in session through the door and its shim; it
// returns once the process runs (or with why it could not start).
func (m *Manager) Start(session string, req wire.ProcessStart, actor string) (*Proc, error) {
	if err := validate(&req); err != nil {
		return nil, err
	}
	env := req.Env
	if env == nil {
		env = backend.DefaultEnv(session)
	}
	id := newID()
	dir := filepath.Join(m.cfg.Dir, id)
	md := meta{ID: id, Session: session, Argv: req.Argv, TTY: req.TTY, Interactive: req.Interactive,
		RingBytes: m.cfg.RingBytes, Created: time.Now().UTC()}
	if req.Stdin != nil {
		md.Stdin = []byte(*req.Stdin)
	}
	if req.DeadlineS > 0 {
		d := md.Created.Add(time.Duration(req.DeadlineS * float64(time.Second)))
		md.Deadline = &d
	}
	// The process's directory (a spare's, renamed: it holds its rings and
	// socket already) and meta.json are written beside the door's record
	// (they start nothing: the job goes to the shim only once the door has
	// returned, the record durable). A directory left with meta.json and
	// no started.json (the agent killed meanwhile) is removed by the next
	// Open.
	var sp *spare
	made := false
	layout := func(pl *backend.PreparedLaunch) error {
		md.Tree, md.Prepared, md.Files = pl.Tree, pl.Args, len(pl.Files)
		if sp = m.takeSpare(); sp != nil && sp.take(dir) != nil {
			sp = nil
		}
		if sp == nil {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return fmt.Errorf("procs: %w", err)
			}
		}
		made = true
		return writeJSON(filepath.Join(dir, metaFile), md)
	}
	pl, err := m.cfg.Door.PrepareLaunch(session, backend.LaunchSpec{Argv: req.Argv, Env: env, Dir: req.Cwd},
		backend.LaunchOptions{UID: req.UID, GID: req.GID}, actor, layout)
	if err != nil {
		if sp != nil {
			sp.abandon() // its directory is dir now: removed
		} else if made {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	fail := func(err error) (*Proc, error) {
		pl.Close(true)
		os.RemoveAll(dir)
		return nil, err
	}
	started, err := m.startShim(dir, pl, sp)
	if err != nil {
		return fail(err)
	}
	pl.Close(false)
	p := newProc(dir, md)
	p.started = started
	if err := p.open(); err != nil {
		return nil, err
	}
	p.adopt()
	m.mu.Lock()
	m.procs[id] = p
	m.mu.Unlock()
	return p, nil
}

// startShim hands the process to sp, a spare shim whose directory is now
// dir, or (sp nil, or gone) starts a shim for it (setsid: its own session
// and process group, nothing the agent's terminal or process group
// receives reaches it), and waits for its report on the status pipe: the
// started record it wrote to started.json before reporting (so the agent
// does not read the file back), or why it failed.
func (m *Manager) startShim(dir string, pl *backend.PreparedLaunch, sp *spare) (startedRecord, error) {
	var st startedRecord
	defer m.goRefill()
	r, w, err := os.Pipe()
	if err != nil {
		if sp != nil {
			sp.abandon()
		}
		return st, err
	}
	defer r.Close()
	var proc *os.Process
	if sp != nil {
		if err := sp.handJob(dir, w, pl.Files); err == nil {
			proc = sp.cmd.Process
			m.awaitReturn(sp)
		} else { // gone or broken: a shim of its own instead, in its place
			sp.cmd.Process.Kill()
			os.Remove(filepath.Join(dir, ctlFile))
		}
	}
	if proc == nil {
		logf, err := os.OpenFile(filepath.Join(dir, shimLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			w.Close()
			return st, err
		}
		defer logf.Close()
		cmd := &exec.Cmd{Path: m.cfg.Shim, Args: []string{ShimArg0, dir}, Env: []string{shimEnv},
			Stdout: logf, Stderr: logf, ExtraFiles: append([]*os.File{w}, pl.Files...),
			SysProcAttr: shimAttr()}
		if err := cmd.Start(); err != nil {
			w.Close()
			return st, fmt.Errorf("procs: start shim: %w", err)
		}
		go cmd.Wait() // reap it when it ends (after the process)
		proc = cmd.Process
	}
	w.Close()
	res := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(r, 4096))
		res <- b
	}()
	select {
	case b := <-res:
		if rec, ok := bytes.CutPrefix(b, []byte(reportOK)); ok {
			if err := json.Unmarshal(rec, &st); err != nil || st.HostPID <= 0 {
				proc.Kill()
				return st, fmt.Errorf("procs: shim reported a start without its record: %q", rec)
			}
			return st, nil
		}
		proc.Kill()
		if len(b) == 0 {
			b, _ = os.ReadFile(filepath.Join(dir, shimLog))
			return st, fmt.Errorf("procs: shim ended without a report: %s", strings.TrimSpace(string(b)))
		}
		for _, k := range execReports {
			if msg, ok := bytes.CutPrefix(b, []byte(k.prefix)); ok {
				return st, startError{string(msg), k.kind}
			}
		}
		return st, fmt.Errorf("procs: %s", b)
	case <-time.After(m.cfg.StartTimeout):
		where := taskStates(proc.Pid)
		proc.Kill()
		return st, fmt.Errorf("procs: the shim did not report a start within %v (its tasks, state and wait channel: %s)", m.cfg.StartTimeout, where)
	}
}

// startError is a shim's report of a start whose program could not be
// executed: its text, and which of backend.ErrExecFailed and
// ErrExecDenied it is (errors.Is).
type startError struct {
	msg  string
	kind error
}

func (e startError) Error() string { return "procs: " + e.msg }
func (e startError) Unwrap() error { return e.kind }

// Get returns session's process id.
func (m *Manager) Get(session, id string) (*Proc, error) {
	m.mu.Lock()
	p, ok := m.procs[id]
	m.mu.Unlock()
	if !ok || p.meta.Session != session {
		return nil, fmt.Errorf("%w: %q in session %q", ErrNotFound, id, session)
	}
	return p, nil
}

// List returns session's processes, oldest first.
func (m *Manager) List(session string) []wire.Process {
	m.mu.Lock()
	var ps []*Proc
	for _, p := range m.procs {
		if p.meta.Session == session {
			ps = append(ps, p)
		}
	}
	m.mu.Unlock()
	out := make([]wire.Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.View())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

// Count is the number of processes held (running or not).
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.procs)
}

// Remove forgets session's processes (its session ended: they were killed
// with it) and removes their directories.
func (m *Manager) Remove(session string) {
	m.mu.Lock()
	var ps []*Proc
	for id, p := range m.procs {
		if p.meta.Session == session {
			ps = append(ps, p)
			delete(m.procs, id)
		}
	}
	m.mu.Unlock()
	for _, p := range ps {
		p.Kill()
		p.close()
		os.RemoveAll(p.dir)
	}
}
