package dataplane

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"golang.org/x/sys/unix"
)

// Kernel ABI limits, mirrored from bpf/shinken_api.bpf.h.
const (
	MaxChain = 8 // handle plus ancestors the kernel walks
	MaxRules = 4 // rules on one (session, prefix) entry
	MaxCover = 8 // covering prefixes one lookup visits
)

// Dataplane is a loaded (or adopted) set of Shinken programs and maps. Its
// methods are safe for concurrent use.
type Dataplane struct {
	cfg     Config
	parent  string // absolute cgroup2 path of the sessions' parent
	level   int    // cgroup level of session cgroups
	objs    shkObjects
	denied  deniedBits // shk_denied, mapped (denied_linux.go)
	links   []link.Link
	adopted bool
	sweep   *sweeper // sweep mode's socket iterators; nil in packet mode
	report  backend.Report
	ops     opCounters
	bnd     *boundary.Boundary // the session boundary; nil without Config.Boundary

	bndAdoptErr string // sessions whose boundary could not be adopted at Open
	sockRead    error  // why the socket count uses its storage fallback; nil: it does not (quota_linux.go)
	sockKern    bool   // the socket count reads the socket's cgroup with plain loads (bpf_cast_to_kern_ctx), not bpf_probe_read_kernel
	markOld     bool   // the agent before kept every socket count in storage: mark what it did not count (quota_linux.go)
	flowsOld    bool   // the agent before kept no flow marks: mark every handle adopted (flowmark_linux.go)

	mu        sync.Mutex
	sessions  map[string]*Session
	byIndex   map[uint32]*Session
	names     sync.Map // uint32 → Session: byIndex for SessionByIndex, read without d.mu
	byName    sync.Map // string → Session: sessions, for the exec gate's reports, read without d.mu
	indices   idPool   // session indices
	prefixes  map[uint32]map[netip.Prefix]struct{}
	cover     map[uint32]*coverIndex           // per session: the cover check's index (cover.go)
	exp       expiring                         // DNS-derived entries: cap and collector (expiry_linux.go)
	neverRefs map[shkShkNeverOkKey][]HandleRef // every handle whose NeverOK rule names the exception (never_ok.go)
	nEntries  [4]int                           // entries in prefixes: egress4, exact4, egress6, exact6
	handleGen []uint32                         // last generation issued per slot
	handleUp  []HandleRef                      // the parent each slot's handle was issued under (reach_linux.go)
	slots     idPool                           // handle slots

	never neverIndex // who names each never-list exception, by handle (never_ok_linux.go)

	files      map[string][]backend.FileEntry // each session's file entries and workspace,
	workspaces map[string]*backend.Workspace  // and both tables, pinned (files_table_linux.go)
	fsTable    *pinnedSet
	procs      map[string][]backend.ProcessEntry // each session's process entries, whether it is gated,
	procGated  map[string]bool                   // and their pinned table (process_linux.go)
	procTable  *pinnedSet
	wsTable    *ebpf.Map
	lsm        lsmState     // fs.scope's BPF LSM layer (files_lsm_linux.go)
	xlsm       execLSMState // the exec allowlist's BPF LSM (exec_lsm_linux.go)
	execEv     execEvents   // the exec gate's denials, counted and reported (execdeny_linux.go)
}

// Open loads the dataplane, or adopts the one pinned at cfg.PinPath: pinned
// maps are reused as they are, and pinned links are switched atomically to
// the newly loaded programs (BPF_LINK_UPDATE), so enforcement never lapses.
func Open(cfg Config) (*Dataplane, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.CgroupRoot == "" {
		root, err := FindCgroup2Mount()
		if err != nil {
			return nil, err
		}
		cfg.CgroupRoot = root
	}
	d := &Dataplane{
		cfg:       cfg,
		parent:    filepath.Join(cfg.CgroupRoot, cfg.Parent),
		sessions:  map[string]*Session{},
		byIndex:   map[uint32]*Session{},
		prefixes:  map[uint32]map[netip.Prefix]struct{}{},
		cover:     map[uint32]*coverIndex{},
		exp:       expiring{due: map[uint32]map[netip.Prefix]uint64{}},
		neverRefs: map[shkShkNeverOkKey][]HandleRef{},
		never:     newNeverIndex(),
		indices:   newIDPool("sessions", cfg.MaxSessions),
		slots:     newIDPool("handles", cfg.MaxHandles),
	}
	_, parentErr := os.Stat(d.parent)
	_, pinErr := os.Stat(cfg.PinPath)
	if err := d.open(); err != nil {
		d.Close()
		// Leave nothing behind that this call created: a pin directory it
		// made goes with whatever it pinned there before failing (maps are
		// pinned before the programs load). Links are closed above, so
		// unpinning detaches them.
		if errors.Is(pinErr, fs.ErrNotExist) {
			os.RemoveAll(cfg.PinPath)
		}
		if errors.Is(parentErr, fs.ErrNotExist) {
			unix.Rmdir(d.parent)
		}
		return nil, err
	}
	if err := d.openFileTable(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.openProcTable(); err != nil {
		d.Close()
		return nil, err
	}
	// The exec LSM before the boundary: its adoption derives each gated
	// session's allowlist into it.
	d.openExecLSM()
	if err := d.openBoundary(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.finishExecLSM(); err != nil {
		d.Close()
		return nil, fmt.Errorf("exec LSM: %w", err)
	}
	d.openFSLSM()
	// The never-list holds from the start; the daemon adds its listeners.
	// An adopted list is kept when it already holds the defaults.
	if err := d.ensureNeverDefaults(); err != nil {
		d.Close()
		return nil, err
	}
	d.report = d.probe()
	return d, nil
}

func (d *Dataplane) open() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	if err := claimParent(d.parent, d.cfg.PinPath); err != nil {
		return err
	}
	lvl, err := cgroupLevel(d.cfg.CgroupRoot, d.parent)
	if err != nil {
		return err
	}
	d.level = lvl + 1
	if err := ensureBPFFS(filepath.Dir(d.cfg.PinPath)); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(d.cfg.PinPath, "links"), 0o700); err != nil {
		return fmt.Errorf("create pin path: %w", err)
	}

	spec, err := loadShk()
	if err != nil {
		return fmt.Errorf("load BPF spec: %w", err)
	}
	sizes := map[string]uint32{
		"shk_sessions":     d.cfg.MaxSessions,
		"shk_handles":      d.cfg.MaxHandles,
		"shk_handle_flows": d.cfg.MaxHandles,
		"shk_egress4":      d.cfg.MaxEgress4,
		"shk_egress6":      d.cfg.MaxEgress6,
		"shk_exact4":       d.cfg.MaxEgress4,
		"shk_exact6":       d.cfg.MaxEgress6,
		"shk_counters":     d.cfg.MaxSessions * NumReasons,
		"shk_quotas":       d.cfg.MaxSessions,
		"shk_budgets":      d.cfg.MaxSessions * 2,
		"shk_suppressed":   d.cfg.MaxSessions,
		"shk_denied":       deniedWords(d.cfg.MaxSessions),
		"shk_events":       d.cfg.EventRingBytes,
		"shk_flows":        d.cfg.MaxFlows,
		"shk_ports":        uint32(min(max(65536, 4*uint64(d.cfg.MaxSessions)), 1<<24)), // port holds (bpf/ports.bpf.h)
	}
	for name, m := range spec.Maps {
		if n, ok := sizes[name]; ok {
			m.MaxEntries = n
		}
		// shk_never_hints is not pinned: each load starts from all zero
		// (every never-list lookup made) until it writes its own
		// (never_hint_linux.go), whatever an earlier agent left.
		if strings.HasPrefix(name, "shk_") && name != "shk_never_hints" {
			m.Pinning = ebpf.PinByName
		}
	}
	if err := spec.Variables["shk_session_level"].Set(uint32(d.level)); err != nil {
		return fmt.Errorf("configure session level: %w", err)
	}
	mode, err := resolveFlowMode(d.cfg.FlowMode)
	if err != nil {
		return err
	}
	d.cfg.FlowMode = mode
	if err := spec.Variables["shk_flow_mode"].Set(uint32(mode)); err != nil {
		return fmt.Errorf("configure flow mode: %w", err)
	}
	if err := spec.Variables["shk_max_socks"].Set(d.cfg.MaxSocketsPerSession); err != nil {
		return fmt.Errorf("configure socket limit: %w", err)
	}
	if err := spec.Variables["shk_max_ports"].Set(d.cfg.MaxPortsPerSession); err != nil {
		return fmt.Errorf("configure port limit: %w", err)
	}
	if err := d.setEventBudget(spec.Variables); err != nil {
		return err
	}
	if err := spec.Variables["shk_skb_task_info"].Set(boolU32(skbTaskInfo())); err != nil {
		return fmt.Errorf("configure packet-denial task info: %w", err)
	}
	d.chooseSocketCount(spec)
	_, statErr := os.Stat(filepath.Join(d.cfg.PinPath, "shk_handles"))
	d.adopted = statErr == nil
	_, markErr := os.Stat(filepath.Join(d.cfg.PinPath, "shk_sockcount"))
	d.markOld = d.adopted && markErr != nil
	_, deniedErr := os.Stat(filepath.Join(d.cfg.PinPath, "shk_denied"))
	_, flowsErr := os.Stat(filepath.Join(d.cfg.PinPath, "shk_handle_flows"))
	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.cfg.PinPath}})
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return fmt.Errorf("pinned maps under %s do not match this agent's sizes or layout (remove them with a full uninstall to start fresh): %w", d.cfg.PinPath, err)
		}
		return fmt.Errorf("load BPF objects: %w", err)
	}
	// Handles adopted from an agent that kept no flow marks each count as
	// one a flow may be open under: reconcileHandles marks them as it reads
	// the table (flowmark_linux.go).
	d.flowsOld = d.adopted && flowsErr != nil
	// Counters adopted from an agent that kept no marker: every index is
	// marked, so none of them is left out of a scrape.
	if err := d.mapDenied(d.adopted && deniedErr != nil); err != nil {
		return err
	}
	if !d.cfg.noAttach {
		if err := d.attach(); err != nil {
			return err
		}
		if mode == FlowSweep {
			if err := d.startSweeper(); err != nil {
				return err
			}
		}
	}
	if err := d.reconcile(); err != nil {
		return err
	}
	d.startExpiry()
	// Flows whose authority died while no agent ran (a deadline passed)
	// end now; deadlines still ahead get their sweep.
	if _, err := d.Sweep(); err != nil {
		return fmt.Errorf("initial sweep: %w", err)
	}
	return d.watchDeadlines()
}

// watchDeadlines arranges a sweep at each live handle's deadline.
func (d *Dataplane) watchDeadlines() error {
	if d.sweep == nil {
		return nil
	}
	hs, err := d.Handles()
	if err != nil {
		return err
	}
	for _, h := range hs {
		if h.State.Alive() && !h.Expires.IsZero() {
			d.watchDeadline(h.Ref, h.Expires)
		}
	}
	return nil
}

// Adopted reports whether Open found a pinned dataplane and took it over.
func (d *Dataplane) Adopted() bool { return d.adopted }

// ParentPath is the cgroup2 directory the programs are attached to.
func (d *Dataplane) ParentPath() string { return d.parent }

// Config returns the effective configuration.
func (d *Dataplane) Config() Config { return d.cfg }

// Close releases this process's references. Pinned programs, links and maps
// stay in the kernel and keep enforcing.
func (d *Dataplane) Close() error {
	d.stopExpiry()
	d.closeBoundary()
	var errs []error
	if d.sweep != nil {
		d.sweep.close()
		d.sweep = nil
	}
	for _, l := range d.links {
		errs = append(errs, l.Close())
	}
	d.links = nil
	errs = append(errs, d.closeFSLSM(), d.closeExecLSM())
	errs = append(errs, d.closeFileTable())
	errs = append(errs, d.procTable.Close())
	d.procTable = nil
	errs = append(errs, d.unmapDenied())
	errs = append(errs, d.objs.Close())
	return errors.Join(errs...)
}

// Uninstall detaches everything, kills the processes of every session,
// removes the session cgroups, the parent cgroup and the pins. It is for
// tests and for a full uninstall, never for a restart.
func (d *Dataplane) Uninstall() error {
	err := d.Close()
	return errors.Join(err, Remove(d.cfg))
}

// Remove is Uninstall without loading anything: it works whatever the pinned
// maps' sizes or layout. Unpinning a link that nothing else holds detaches it.
func Remove(cfg Config) error {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.CgroupRoot == "" {
		root, err := FindCgroup2Mount()
		if err != nil {
			return err
		}
		cfg.CgroupRoot = root
	}
	var errs []error
	parent := filepath.Join(cfg.CgroupRoot, cfg.Parent)
	if _, err := os.Stat(parent); err == nil {
		if err := ownsParent(parent, cfg.PinPath); err != nil {
			return fmt.Errorf("uninstall: %w", err)
		}
	}
	// Sessions die before the programs go, so no session process ever runs
	// unconfined.
	if ents, err := os.ReadDir(parent); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				errs = append(errs, killCgroup(cfg.CgroupRoot, filepath.Join(parent, e.Name())))
			}
		}
	}
	for _, dir := range []string{filepath.Join(cfg.PinPath, "links"), cfg.PinPath} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		for _, e := range ents {
			if e.IsDir() {
				continue
			}
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	for _, dir := range []string{filepath.Join(cfg.PinPath, "links"), cfg.PinPath} {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, killCgroup(cfg.CgroupRoot, parent))
	return errors.Join(errs...)
}

// reconcile rebuilds the in-memory indexes from the maps and the cgroup tree,
// repairing drift in the fail-closed direction: a session map entry whose
// cgroup is gone is removed, and egress entries of no session are deleted.
func (d *Dataplane) reconcile() error {
	d.mu.Lock()
	defer d.mu.Unlock()

	byID := map[uint64]string{}
	ents, err := os.ReadDir(d.parent)
	if err != nil {
		return fmt.Errorf("list sessions: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(d.parent, e.Name())
		id, err := cgroupID(p)
		if err != nil {
			return err
		}
		byID[id] = e.Name()
	}

	var (
		cgid  uint64
		sess  shkShkSession
		stale []uint64
		used  = map[uint32]bool{}
	)
	it := d.objs.ShkSessions.Iterate()
	for it.Next(&cgid, &sess) {
		name, ok := byID[cgid]
		if !ok || sess.Index == 0 || sess.Index >= d.cfg.MaxSessions || used[sess.Index] {
			stale = append(stale, cgid)
			continue
		}
		s := &Session{Name: name, Index: sess.Index, CgroupID: cgid, Path: filepath.Join(d.parent, name)}
		d.sessions[name] = s
		d.byIndex[s.Index] = s
		d.names.Store(s.Index, *s)
		d.byName.Store(name, *s)
		used[s.Index] = true
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read sessions: %w", err)
	}
	for _, id := range stale {
		if err := d.objs.ShkSessions.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("drop stale session %d: %w", id, err)
		}
	}
	// Cgroups without a session entry (a create that crashed half way) are
	// denied everything by the kernel already; remove the empty ones.
	for _, name := range byID {
		if _, known := d.sessions[name]; !known {
			_ = unix.Rmdir(filepath.Join(d.parent, name))
		}
	}
	if err := d.pruneQuotas(); err != nil {
		return err
	}
	maxIdx := uint32(0)
	for idx := range used {
		maxIdx = max(maxIdx, idx)
	}
	d.indices.rebuild(func(id uint32) bool { return used[id] }, maxIdx)

	if err := d.reconcileEgress(); err != nil {
		return err
	}
	return d.reconcileHandles()
}

func (d *Dataplane) reconcileEgress() error {
	for _, m := range []struct {
		m  *ebpf.Map
		v6 bool
	}{{d.objs.ShkEgress4, false}, {d.objs.ShkExact4, false}, {d.objs.ShkEgress6, true}, {d.objs.ShkExact6, true}} {
		if err := d.reconcileEgressMap(m.m, m.v6); err != nil {
			return err
		}
	}
	return nil
}

// reconcileEgressMap indexes one egress map's entries and deletes those of no
// session.
func (d *Dataplane) reconcileEgressMap(m *ebpf.Map, v6 bool) error {
	var (
		stale []any
		err   error
	)
	if !v6 {
		err = eachEntry(m, func(k4 *shkShkEgress4Key, v *shkShkEgressValue) {
			if _, ok := d.byIndex[k4.Session]; !ok || k4.Prefixlen < 32 || k4.Prefixlen > 64 {
				stale = append(stale, *k4)
				return
			}
			p := netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen-32))
			d.indexPrefix(k4.Session, p)
			d.scheduleExpiry(k4.Session, p, earliestExpiry(v))
			d.indexNeverOKs(k4.Session, p, v)
		})
	} else {
		err = eachEntry(m, func(k6 *shkShkEgress6Key, v *shkShkEgressValue) {
			if _, ok := d.byIndex[k6.Session]; !ok || k6.Prefixlen < 32 || k6.Prefixlen > 160 {
				stale = append(stale, *k6)
				return
			}
			p := netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen-32))
			d.indexPrefix(k6.Session, p)
			d.scheduleExpiry(k6.Session, p, earliestExpiry(v))
			d.indexNeverOKs(k6.Session, p, v)
		})
	}
	if err != nil {
		return err
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("purge stale egress entry: %w", err)
		}
	}
	return nil
}

func (d *Dataplane) reconcileHandles() error {
	n := d.cfg.MaxHandles
	d.handleGen = make([]uint32, n)
	d.handleUp = make([]HandleRef, n)
	highest := uint32(0)
	states := make([]uint32, n)
	var issued []HandleRef // for flowsOld
	err := eachArray(d.objs.ShkHandles, func(key uint32, h *shkShkHandle) {
		if key >= n {
			return
		}
		d.handleGen[key] = h.Generation
		d.handleUp[key] = HandleRef{Slot: h.Parent, Generation: h.ParentGeneration}
		states[key] = h.State
		if h.State != uint32(HandleFree) || h.Generation != 0 {
			highest = key
		}
		if d.flowsOld && h.State != uint32(HandleFree) {
			issued = append(issued, HandleRef{Slot: key, Generation: h.Generation})
		}
	})
	if err != nil {
		return fmt.Errorf("read handles: %w", err)
	}
	if d.flowsOld {
		if err := d.markAdoptedHandles(issued); err != nil {
			return err
		}
		d.flowsOld = false
	}
	d.slots.rebuild(func(id uint32) bool { return states[id] != uint32(HandleFree) }, highest)
	return nil
}

func sleepBriefly(i int) {
	if i < 10 {
		time.Sleep(time.Millisecond)
		return
	}
	time.Sleep(5 * time.Millisecond)
}
