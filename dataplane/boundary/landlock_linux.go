package boundary

// The Landlock baseline (issue 19): the second, fixed layer under the
// session's mount view. Every launch enters a Landlock domain that handles
// every filesystem right this kernel knows and allows all of them beneath
// a set of paths built from the filesystem hierarchy so that it leaves out
// the credential locations (Config.FileNever: the agent's state and policy
// directories and socket, /root, the shadow files, the container runtimes'
// sockets, each home's .ssh, .aws, .config/gcloud, ...): starting at /, a
// directory that holds a credential location is descended (it gets no
// rule of its own), every other entry gets a rule, a credential location
// none. Landlock is an allowlist, so this is how it denies: nothing
// beneath a credential location is allowed any right, read or write or
// execute, whatever the mount view shows there, and no grant can change a
// domain already entered.
//
// The split: Landlock denies the credential locations absolutely and is
// fixed at exec; everywhere else it allows everything, and the mount view
// (read-only host, the workspace's and the grants' writable binds, made and
// revoked while the session runs) and file permissions decide what is
// writable. Landlock cannot take that role: fs grants come and go while a
// process runs, and a domain cannot be widened or narrowed after exec.
//
// Rules name inodes. They are opened in the session's mount namespace
// with the session's uid (by the agent, once per session; each launch
// enters the ruleset: ruleset_linux.go), so that the session's own mounts
// (its /tmp, /dev and /dev/shm, /proc) are ruled by their own roots: Landlock walks up through
// a mount to the directory it is mounted on, skipping that directory
// itself, so a rule on the host's /tmp would not cover the session's.
// For the same reason a persistence mount (its files are the agent's, in a
// credential location) gets a rule on its own root. Credential locations
// under the session's own mounts are not the session's to see and are left
// out of the descent.
//
// An admin override (backend.FileEntry.Override: an admin policy names the
// location, and a grant names it or a path in it) is the one way in: the
// view mounts what the grant gives there, and every launch after that
// gets a rule on that mount's root, so its processes may use it. Fixed at
// exec means two things here. A process launched before the override
// keeps its domain, which denies the location: the override does not
// reach it (launch again). A process launched while the override was in
// force keeps a domain that allows the location after the override goes
// (the policy removed and reloaded, or the grant revoked): there the view
// alone takes it back, at the next open (revocable at next use), as for
// any grant. The agent's own state and policy directories and socket
// (Config.FileNeverFixed) and the container runtimes' sockets are never
// overridden.
//
// What it cannot do: a credential location made after a launch (a home's
// .ssh created later) is beneath a rule of that launch's domain; a launch
// after it leaves it out (the rules are rebuilt when a descended
// directory's modification time changes). Entries added to a descended
// directory after a launch (a new file in /etc) are not readable by the
// processes of that launch (no rule): they are by the next launches.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// landlockFSRights is the filesystem rights a domain handles at this ABI:
// those of ABI 1, refer (ABI 2: without it handled, Landlock refuses every
// rename and link across directories), truncate (3), ioctl on devices (5).
func landlockFSRights(abi int) uint64 {
	if abi < 2 {
		return 0
	}
	r := uint64(ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSRemoveDir |
		ll.AccessFSRemoveFile | ll.AccessFSMakeChar | ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSock |
		ll.AccessFSMakeFifo | ll.AccessFSMakeBlock | ll.AccessFSMakeSym | ll.AccessFSRefer)
	if abi >= 3 {
		r |= ll.AccessFSTruncate
	}
	if abi >= 5 {
		r |= ll.AccessFSIoctlDev
	}
	return r
}

// sessionOwnMounts are the directories the session's mount namespace
// mounts its own filesystems on (boundary init; /run and a /var/run of its
// own: child/run_linux.go): what the host has there is not the session's
// view. A credential location beneath one (a runtime socket in /run) is
// not in the session's view at all, so it needs no Landlock rule, and the
// session's own mount gets one rule as a whole.
var sessionOwnMounts = []string{"/tmp", "/dev", "/proc", "/run", "/var/run"}

// landlockTree is the rules of the hierarchy and what they were built from.
type landlockTree struct {
	mu      sync.Mutex
	rules   []string
	stamps  map[string]unix.Timespec // each descended directory's mtime
	inodes  map[string]uint64
	built   time.Time // when the walk began
	skipOwn bool
	gen     uint64 // counts the builds: a session's cached ruleset names the one it holds
}

// racyWindow: a directory whose mtime lies this close before the walk
// began (or after it) may change again with the same mtime (filesystems
// stamp with the kernel's coarse clock, one tick), so the rules built
// from it are not trusted: they are built again at the next get, until
// the directory is older than this (git's "racily clean" rule).
const racyWindow = 100 * time.Millisecond

// rules returns the hierarchy's rules for never, rebuilt if a descended
// directory changed since they were built.
func (t *landlockTree) get(never []string, skipOwn bool) ([]string, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stamps != nil && t.skipOwn == skipOwn && t.fresh() {
		return t.rules, t.gen
	}
	t.gen++
	t.skipOwn = skipOwn
	t.built = time.Now()
	t.stamps, t.inodes = map[string]unix.Timespec{}, map[string]uint64{}
	t.rules = landlockRules(never, skipOwn, func(dir string, st *unix.Stat_t) {
		t.stamps[dir], t.inodes[dir] = st.Mtim, st.Ino
	})
	return t.rules, t.gen
}

func (t *landlockTree) fresh() bool {
	racy := t.built.Add(-racyWindow)
	for d, m := range t.stamps {
		var st unix.Stat_t
		if unix.Lstat(d, &st) != nil || st.Mtim != m || st.Ino != t.inodes[d] || time.Unix(m.Unix()).After(racy) {
			return false
		}
	}
	return true
}

// landlockRules walks the hierarchy from / and returns the paths that get
// a rule: every entry of a descended directory that is neither a
// credential location nor holds one (those are descended), symbolic links
// left out (what they point to is ruled where it lies). A credential
// location that does not exist is not descended to; with skipOwn, neither
// is one under the session's own mounts. seen is called for each
// descended directory.
func landlockRules(never []string, skipOwn bool, seen func(string, *unix.Stat_t)) []string {
	var deny []string
	for _, n := range never {
		n = filepath.Clean(n)
		if !filepath.IsAbs(n) || n == "/" {
			continue
		}
		if skipOwn && slices.ContainsFunc(sessionOwnMounts, func(m string) bool { return n == m || strings.HasPrefix(n, m+"/") }) {
			continue
		}
		if _, err := os.Lstat(n); err == nil {
			deny = append(deny, n)
		}
	}
	if len(deny) == 0 {
		return []string{"/"}
	}
	holds := func(p string) bool {
		return slices.ContainsFunc(deny, func(d string) bool { return strings.HasPrefix(d, p+"/") || p == "/" })
	}
	var rules []string
	var walk func(dir string)
	walk = func(dir string) {
		var st unix.Stat_t
		if unix.Lstat(dir, &st) != nil {
			return
		}
		seen(dir, &st)
		ents, err := os.ReadDir(dir)
		if err != nil {
			return // unreadable: nothing beneath gets a rule
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			switch {
			case slices.Contains(deny, p):
			case e.Type()&os.ModeSymlink != 0:
			case e.IsDir() && holds(p):
				walk(p)
			default:
				rules = append(rules, p)
			}
		}
	}
	walk("/")
	return rules
}

// landlockSpec is the Landlock rights and rules of a launch into session
// name: the hierarchy's rules, and the root of each persistence mount of
// its view; and what they were made of (the hierarchy's build, the
// view's rules), for the session's cached ruleset (ruleset_linux.go).
func (b *Boundary) landlockSpec(name string) (uint64, []string, string) {
	if !b.useLandlockFS {
		return 0, nil, ""
	}
	rules, gen := b.llTree.get(b.cfg.FileNever, b.useNS)
	b.mu.Lock()
	v := b.views[name]
	var extra []string
	if v != nil {
		for _, m := range v.layout {
			if m.Source != "" {
				extra = append(extra, m.Path)
				continue
			}
			// A credential location an admin override opens in the view
			// (the layout shows it only then): this launch's domain
			// allows it too. Domains entered before the override keep it
			// denied; the view takes it back when the override goes.
			if _, in := v.spec.credentialAt(m.Path); in && !m.Pin && (m.State == ViewRead || m.State == ViewWrite) {
				extra = append(extra, m.Path)
			}
		}
	}
	b.mu.Unlock()
	if len(extra) > 0 {
		rules = append(slices.Clip(rules), extra...)
	}
	fs := landlockFSRights(b.landlockABI)
	return fs, rules, fmt.Sprintf("%d %d\n%s", fs, gen, strings.Join(extra, "\n"))
}
