package dataplane

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// The denial-event budget (bpf/events.bpf.h): each session sends at most
// Config.DenialEventBurst denial events at once and Config.DenialEventRate
// a second after that from each of two buckets, its own attempts and what
// others do to it (no_inbound, flow_revoked); the rest are counted, per
// session and in all, and not sent.

// setEventBudget sets the budget's load-time constants in vars (the main
// object's, and the fs.scope LSM object's, which shares its maps).
func (d *Dataplane) setEventBudget(vars map[string]*ebpf.VariableSpec) error {
	interval := uint64(1e9) / uint64(d.cfg.DenialEventRate)
	tolerance := uint64(d.cfg.DenialEventBurst-1) * interval
	if err := vars["shk_event_interval_ns"].Set(interval); err != nil {
		return fmt.Errorf("configure denial event budget: %w", err)
	}
	if err := vars["shk_event_tolerance_ns"].Set(tolerance); err != nil {
		return fmt.Errorf("configure denial event budget: %w", err)
	}
	return nil
}

// EventBudget describes the denial-event budget in force, for the probe
// report.
func (d *Dataplane) EventBudget() string {
	return fmt.Sprintf("%d denial events a second per session, %d at once, for its own attempts and again for refusals others cause (no_inbound, flow_revoked) (in-kernel, shared by all the session's CPUs; the rest counted, not sent)",
		d.cfg.DenialEventRate, d.cfg.DenialEventBurst)
}

// zeroBudget gives a session index a full budget and no suppressed events
// (the index may have been another session's).
func (d *Dataplane) zeroBudget(idx uint32) error {
	for b := uint32(0); b < 2; b++ {
		if err := d.objs.ShkBudgets.Update(idx*2+b, shkShkBudget{}, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("reset event budget: %w", err)
		}
	}
	if err := d.objs.ShkSuppressed.Update(idx, make([]uint64, possibleCPUs()), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset suppressed events: %w", err)
	}
	return nil
}

// EventsSuppressed is the number of denial events of the session at index
// the budget kept off the ring buffer (their denials were counted in
// Counters). Index 0 is what no session owns.
func (d *Dataplane) EventsSuppressed(index uint32) (uint64, error) {
	if index >= d.cfg.MaxSessions {
		return 0, fmt.Errorf("%w: index %d", ErrSessionNotFound, index)
	}
	return sumPerCPU(d.objs.ShkSuppressed, index)
}

// EventsSuppressedTotal is the number of denial events the budget kept off
// the ring buffer, all sessions together, since the maps were made.
func (d *Dataplane) EventsSuppressedTotal() (uint64, error) {
	return sumPerCPU(d.objs.ShkStats, statEventsSuppressed)
}

// statEventsSuppressed is SHK_STAT_EVENTS_SUPPRESSED.
const statEventsSuppressed = 1

func sumPerCPU(m *ebpf.Map, key uint32) (uint64, error) {
	var per []uint64
	if err := m.Lookup(key, &per); err != nil {
		return 0, fmt.Errorf("read %s: %w", m.String(), err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

func possibleCPUs() int {
	n, err := ebpf.PossibleCPU()
	if err != nil || n < 1 {
		return 1
	}
	return n
}
