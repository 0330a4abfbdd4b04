package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// What the BPF LSM objects (fs.scope's shkfs, the exec gate's shkexec)
// share in how they are loaded: each is an object of its own, so that a
// host where LSM programs cannot load still loads the main one; each uses
// the main object's session, handle, counter, statistics, event,
// event-budget and denied-marker maps; each keeps its own maps and links
// pinned, so that a restarted agent finds them.

// loadLSMObject loads spec into objs: own names the object's own maps,
// pinned by name, with their sizes (0: as compiled); the session level
// and the denial-event budget are set, and the main object's maps are
// handed in.
func (d *Dataplane) loadLSMObject(spec *ebpf.CollectionSpec, own map[string]uint32, objs any) error {
	for n, size := range own {
		m := spec.Maps[n]
		if m == nil {
			return fmt.Errorf("LSM object: no map %s", n)
		}
		if size != 0 {
			m.MaxEntries = size
		}
		m.Pinning = ebpf.PinByName
	}
	if err := spec.Variables["shk_session_level"].Set(uint32(d.level)); err != nil {
		return fmt.Errorf("configure session level: %w", err)
	}
	if err := d.setEventBudget(spec.Variables); err != nil {
		return err
	}
	shared := map[string]*ebpf.Map{
		"shk_sessions": d.objs.ShkSessions, "shk_handles": d.objs.ShkHandles,
		"shk_counters": d.objs.ShkCounters, "shk_stats": d.objs.ShkStats, "shk_events": d.objs.ShkEvents,
		"shk_budgets": d.objs.ShkBudgets, "shk_suppressed": d.objs.ShkSuppressed, "shk_denied": d.objs.ShkDenied,
	}
	for n, m := range shared {
		if spec.Maps[n] != nil {
			spec.Maps[n].MaxEntries = m.MaxEntries() // sized at the main object's load
		}
	}
	return spec.LoadAndAssign(objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.cfg.PinPath}, MapReplacements: shared})
}

// attachLSM attaches prog to LSM hook and pins the link as links/name
// under the pin path; a previous agent's link there goes only once the
// new one is attached. The link is returned when pinning fails too, for
// the caller to close.
func (d *Dataplane) attachLSM(prog *ebpf.Program, hook, name string) (link.Link, error) {
	l, err := link.AttachLSM(link.LSMOptions{Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach lsm/%s: %w", hook, err)
	}
	pin := filepath.Join(d.cfg.PinPath, "links", name)
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		old.Unpin()
		old.Close()
	}
	if err := l.Pin(pin); err != nil {
		return l, fmt.Errorf("pin lsm/%s: %w", hook, err)
	}
	return l, nil
}

// lsmLoadError says why an LSM object did not load: err, with the
// kernel's LSM list when BPF LSM is not in it (or the list is unreadable).
func lsmLoadError(err error) error {
	lsms, rerr := os.ReadFile("/sys/kernel/security/lsm")
	switch {
	case rerr != nil:
		return fmt.Errorf("the kernel's LSM list is unreadable (%w), and: %w", rerr, err)
	case !slices.Contains(strings.Split(strings.TrimSpace(string(lsms)), ","), "bpf"):
		return fmt.Errorf("BPF LSM is not active (the kernel's LSM list is %s): %w", strings.TrimSpace(string(lsms)), err)
	}
	return err
}
