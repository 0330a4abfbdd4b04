package boundary

// The session's Landlock baseline, built once (issue 20). Opening and
// adding a few hundred rule paths (landlock_linux.go) cost every launch
// 0.7-0.8 ms in the launcher. A Landlock ruleset can be entered by any
// number of landlock_restrict_self calls, so the agent builds a session's
// ruleset once, on a thread in the session's mount namespace with the
// session's uid, gid, no supplementary group and no capability (as the
// launcher opened the rules: the same paths resolve to the same inodes,
// the same EACCES fails the launch), keeps its descriptor, and hands each
// launch a duplicate at an inherited descriptor; the launcher enters it
// and closes it before it executes the target (child.Launch.Ruleset).
//
// Invalidation. What the ruleset is made of: the hierarchy's rules (their
// build counter, bumped when a descended directory changed), the view's
// rules (persistence roots, credential locations an override opens), the
// rights and scopes, and the inodes the paths named in the session's mount
// namespace when it was built. The first three are its key, compared at
// every launch; the mounts are not (reading them back would cost what the
// cache saves), so every change of the session's view drops the ruleset
// before its first mount step and again after its last (updateView), as
// do a new holder (Create, Adopt: a new mount namespace), SeedWorkspace and
// Release. A build that overlapped a drop is not kept (the session's
// generation moved). So a launch never enters a ruleset built before a
// change of the view that ended before the launch began.
//
// Built ahead (prebuild) when a session's holder starts for an operation
// that is not a launch (a file get or put, a process grant: lazy_linux.go;
// Create starts no holder, and a launch that starts one builds its ruleset
// itself): that operation queues the session and
// one goroutine builds the queued sessions' rulesets in the background,
// newest first, through the same path and generation check as a launch
// (sessionRuleset), so a session's first launch finds its ruleset cached
// instead of building it beside the audit record's syncs. A change of the
// view after the start drops it as before (the next launch builds it); a
// build that fails is not kept and the launch builds again and says why.
// A prebuilt ruleset counts as least recently used until a launch enters
// it (a launch's build replaces it first), and a prebuild never replaces
// one that no launch has used yet: in a burst of creates the first
// maxRulesets sessions get theirs, the later ones none (their first
// launch builds), so a burst costs at most maxRulesets builds and does
// not churn the cache. At most maxPrebuildQueue sessions wait; the oldest
// queued are forgotten. Adopt of a live holder
// queues nothing: an agent that restarts with thousands of sessions would
// build rulesets the cache cannot keep.
//
// What holds it: the agent, one descriptor per session that launched
// recently, at most maxRulesets (the least recently used goes): every fork
// the agent makes copies its descriptor table (see holder), so it keeps no
// descriptor per session for 10,000 sessions. Each launch gets its own
// duplicate (close-on-exec in the agent and in the shim); the launcher
// marks it close-on-exec at once and closes it once entered. A session
// process never holds it: with it, landlock_add_rule could add a rule
// (O_PATH opens are not checked by Landlock) to the ruleset every later
// launch of the session enters (TestRulesetNotInherited).
//
// A program that embeds the boundary must not call an all-threads
// credential system call (Go's syscall.Setuid, Setgid, Setgroups and
// kin: the runtime's AllThreadsSyscall) while a ruleset is being built
// (at a launch, or in the background after each Create):
// the build thread has no capability, its setgroups fails, and the
// runtime aborts the process ("results differ between threads"). Shown
// with a loop of syscall.Setgroups beside launches; the agent never makes
// such a call. Every build holds buildGate for reading; the tests that
// set this process's groups hold it for writing (no build starts), then
// wait until no thread has other credentials (setgroupsAllThreads).

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"
	"golang.org/x/sys/unix"
)

// maxRulesets bounds the sessions whose ruleset the agent keeps: each
// costs the kernel about 10 KiB (158 rules on this project's hosts) and the
// agent a descriptor that each of its forks copies. At 256, 500 sessions
// launching in turn rebuilt a ruleset at every launch (least recently used
// goes first, so a cycle longer than the cache never hits): about 1.4 ms of
// CPU each (bench/README.md, the twenty-third session).
const maxRulesets = 1024

// maxPrebuildQueue bounds the sessions waiting for a prebuild.
const maxPrebuildQueue = 64

// buildGate is held for reading by every ruleset build (launch or
// prebuild) while its thread, which drops every capability, runs; held
// for writing, no build starts (see the all-threads warning above).
var buildGate sync.RWMutex

type cachedRuleset struct {
	fd   int
	key  string
	gen  uint64
	used uint64
}

// rulesetCache is the sessions' cached rulesets. gens holds a session's
// generation while its holder is known (Create, Adopt to Release): values
// are drawn from seq, so a generation is never seen twice.
type rulesetCache struct {
	mu     sync.Mutex
	sets   map[string]*cachedRuleset
	gens   map[string]uint64
	seq    uint64
	tick   uint64
	builds atomic.Uint64 // rulesets built by launches (tests)

	queue     []string      // sessions waiting for a prebuild, newest last
	building  bool          // the prebuild goroutine runs
	prebuilds atomic.Uint64 // rulesets built ahead (tests)
}

// drop forgets session name's ruleset and moves its generation (a build
// under way is not kept); with gone, the session is forgotten.
func (c *rulesetCache) drop(name string, gone bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sets == nil {
		c.sets, c.gens = map[string]*cachedRuleset{}, map[string]uint64{}
	}
	if s := c.sets[name]; s != nil {
		unix.Close(s.fd)
		delete(c.sets, name)
	}
	if gone {
		delete(c.gens, name)
		return
	}
	c.seq++
	c.gens[name] = c.seq
}

// get returns a duplicate (close-on-exec) of session name's ruleset if it
// is built for key, and the generation a new build must be kept under.
func (c *rulesetCache) get(name, key string) (int, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gen, known := c.gens[name]
	s := c.sets[name]
	if !known || s == nil || s.key != key || s.gen != gen {
		return -1, gen, known
	}
	c.tick++
	s.used = c.tick
	fd, err := unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return -1, gen, known
	}
	return fd, gen, known
}

// put keeps fd (which the cache then owns) as session name's ruleset for
// key if the session's generation is still gen and, for a prebuild (pre),
// there is room (roomFor); it returns a duplicate for the caller, or fd
// itself when it is not kept.
func (c *rulesetCache) put(name, key string, gen uint64, fd int, pre bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g, ok := c.gens[name]; !ok || g != gen {
		return fd
	}
	if pre && !c.roomLocked(name) {
		return fd
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return fd
	}
	if old := c.sets[name]; old != nil {
		unix.Close(old.fd)
		delete(c.sets, name)
	}
	if len(c.sets) >= maxRulesets {
		v := c.victimLocked(pre)
		unix.Close(c.sets[v].fd)
		delete(c.sets, v)
	}
	used := uint64(0) // a prebuild: not handed out yet
	if !pre {
		c.tick++
		used = c.tick
	}
	c.sets[name] = &cachedRuleset{fd: fd, key: key, gen: gen, used: used}
	return dup
}

// victimLocked is the ruleset a new one replaces in a full cache: the
// least recently used, one prebuilt and never handed out counting as
// least; for a prebuild (pre), only one handed out at least once ("" if
// none). c.mu held.
func (c *rulesetCache) victimLocked(pre bool) string {
	var v string
	for n, s := range c.sets {
		if pre && s.used == 0 {
			continue
		}
		if v == "" || s.used < c.sets[v].used {
			v = n
		}
	}
	return v
}

// roomFor says whether a prebuild of session name's ruleset would be
// kept: a prebuild never replaces another that no launch has used yet, so
// a burst of creates builds at most maxRulesets ahead and then nothing.
func (c *rulesetCache) roomFor(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roomLocked(name)
}

func (c *rulesetCache) roomLocked(name string) bool {
	return len(c.sets) < maxRulesets || c.sets[name] != nil || c.victimLocked(true) != ""
}

// prebuild queues session name for a ruleset built in the background
// (Create), and starts the goroutine that builds them if none runs.
func (b *Boundary) prebuild(name string) {
	if !b.useLandlockFS || !b.useNS {
		return
	}
	c := &b.rulesets
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queue = slices.DeleteFunc(c.queue, func(n string) bool { return n == name })
	if len(c.queue) >= maxPrebuildQueue {
		c.queue = slices.Delete(c.queue, 0, 1)
	}
	c.queue = append(c.queue, name)
	if !c.building {
		c.building = true
		go b.prebuildLoop()
	}
}

// prebuildLoop builds the queued sessions' rulesets, newest first, until
// the queue is empty.
func (b *Boundary) prebuildLoop() {
	c := &b.rulesets
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.building = false
			c.mu.Unlock()
			return
		}
		name := c.queue[len(c.queue)-1]
		c.queue = c.queue[:len(c.queue)-1]
		c.mu.Unlock()
		b.mu.Lock()
		h, ok := b.holders[name]
		b.mu.Unlock()
		if !ok || !h.started.Load() {
			continue // released meanwhile, or not started (no namespace to build in)
		}
		if !c.roomFor(name) {
			continue // the cache is full of rulesets not used yet
		}
		fs, rules, key := b.landlockSpec(name)
		if fs == 0 {
			continue
		}
		var scoped uint64
		if b.useLandlock {
			scoped = landlockScopes
		}
		// An error is not kept: the session's next launch builds again
		// and fails with it.
		if f, err := b.buildRuleset(name, h, fs, scoped, rules, key, true); err == nil {
			f.Close()
		}
	}
}

// sessionRuleset returns a ruleset for a launch into session name (the
// caller closes it): the cached one, or one built now in h's mount
// namespace as uid from fs, scoped and rules (key: what landlockSpec says
// they were made of).
func (b *Boundary) sessionRuleset(name string, h *holder, fs, scoped uint64, rules []string, key string) (*os.File, error) {
	return b.buildRuleset(name, h, fs, scoped, rules, key, false)
}

// buildRuleset is sessionRuleset; pre says a prebuild asks (counted apart).
func (b *Boundary) buildRuleset(name string, h *holder, fs, scoped uint64, rules []string, key string, pre bool) (*os.File, error) {
	key = fmt.Sprintf("%d %d %s", h.pid, scoped, key)
	fd, gen, _ := b.rulesets.get(name, key)
	if fd >= 0 {
		return os.NewFile(uintptr(fd), "landlock-ruleset"), nil
	}
	pidfd, err := h.open()
	if err != nil {
		return nil, fmt.Errorf("session holder: %w", err)
	}
	defer unix.Close(pidfd)
	// The thread's mount namespace and credentials are the session's.
	buildGate.RLock()
	err = throwaway.Run(func() (err error) {
		fd, err = buildInSession(pidfd, h.uid, fs, scoped, rules)
		return err
	})
	buildGate.RUnlock()
	if err != nil {
		return nil, err
	}
	if pre {
		b.rulesets.prebuilds.Add(1)
	} else {
		b.rulesets.builds.Add(1)
	}
	return os.NewFile(uintptr(b.rulesets.put(name, key, gen, fd, pre)), "landlock-ruleset"), nil
}

// buildInSession runs on a thread of its own (throwaway.Run): it joins
// the session's mount namespace, takes the session's uid and gid for file
// access with no supplementary group and no capability (this thread only:
// raw system calls), and builds the ruleset as the launcher would.
func buildInSession(pidfd int, uid uint32, fs, scoped uint64, rules []string) (int, error) {
	if err := joinMountNS(pidfd); err != nil {
		return -1, err
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return -1, fmt.Errorf("setgroups: %w", e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(uid), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
	// setfsuid and setfsgid return the old value, never an error: -1
	// (invalid) reads the current one.
	fsgid, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0)
	fsuid, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0)
	if uint32(fsuid) != uid || uint32(fsgid) != uid {
		return -1, fmt.Errorf("landlock ruleset: file access as uid %d gid %d: got %d %d", uid, uid, fsuid, fsgid)
	}
	// No capability left on this thread either (setfsuid took the file
	// ones; CAP_SYS_PTRACE would still follow another uid's /proc links):
	// what it opens, the launcher running as the session could open.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return -1, fmt.Errorf("landlock ruleset: drop capabilities: %w", err)
	}
	return child.BuildRuleset(fs, scoped, rules)
}
